"""The orchestrator drops (and dynamic sampling refills) groups of equal rewards whatever the reward value; a new
advantage type is judged by its own advantages, or refused by the filters when only the trainer knows them."""

from __future__ import annotations

import dataclasses
import logging
from typing import ClassVar, Literal

import pytest
import torch

from prime_rl.configs.advantage import AdvantageBase, ComputedIn
from prime_rl.configs.cli import build_config
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.utils.errors import ConfigError
from tests.support.registered_advantage import registered_advantage
from tests.support.scripted_client import ScriptedClient, run_step

# The all-truncated groups all get reward 0.1, whose float32 group mean of 8 is off by an ulp.
EQUAL_REWARD = 0.1
OVERRIDES = {"batch_size": 16, "rollouts_per_example": 8, "truncated_reward": EQUAL_REWARD}


class EqualNonZeroGroups(ScriptedClient):
    """Odd-numbered requests are mixed (half right); even ones are all truncated: every reward is 0.1."""

    async def chat(self, messages, n, *args, **kwargs):
        result = await super().chat(messages, n, *args, **kwargs)
        if self.calls % 2 == 0:
            result.completions = [dataclasses.replace(c, finish_reason="length") for c in result.completions]
        return result


def test_filter_zero_advantage_drops_groups_of_equal_nonzero_rewards(tmp_path):
    metrics, _ = run_step(tmp_path, EqualNonZeroGroups(), filter_zero_advantage=True, **OVERRIDES)
    assert metrics["rollout/filtered_frac"] == 0.5 and metrics["rollout/num_samples"] == 8


def test_unfiltered_groups_of_equal_rewards_train_with_exactly_zero_advantage(tmp_path):
    _, batch = run_step(tmp_path, EqualNonZeroGroups(), **OVERRIDES)
    per_sample = [a for mb in batch.micro_batches
                  for a, trained in zip(mb.advantages.split(mb.sample_lens.tolist()), mb.trained_samples, strict=True)
                  if trained]  # a shared prompt's root is a segment with no trained token
    assert len(per_sample) == 16
    assert sum(not a.any() for a in per_sample) == 8  # the equal group; the mixed one is non-zero everywhere


def test_dynamic_sampling_refills_past_groups_of_equal_nonzero_rewards(tmp_path):
    client = EqualNonZeroGroups()
    metrics, _ = run_step(tmp_path, client, dynamic_sampling=True, **OVERRIDES)
    # Round 0: requests 1 (mixed) and 2 (equal); round 1: request 3 (mixed) fills the batch.
    assert client.calls == 3 and metrics["rollout/num_samples"] == 16
    assert metrics["rollout/filtered_frac"] == pytest.approx(8 / 24)


class MarginConfig(AdvantageBase):
    """A toy type computed here: A_i = r_i - margin (no group baseline)."""

    type: Literal["margin"] = "margin"
    compares_rollouts: ClassVar[bool] = False
    margin: float = 0.0


def margin_advantages(rewards: torch.Tensor, margin: float) -> torch.Tensor:
    return rewards - margin


class TokenToyConfig(AdvantageBase):
    """A toy type computed in the trainer (its advantages are not known here)."""

    type: Literal["token_toy"] = "token_toy"
    computed_in: ClassVar[ComputedIn] = "trainer"
    compares_rollouts: ClassVar[bool] = False


@pytest.mark.parametrize("margin, dropped", [(EQUAL_REWARD, 0.5), (0.0, 0.0)])
def test_a_new_type_computed_here_is_filtered_by_its_own_advantages(tmp_path, margin, dropped):
    # The filter asks the type: at margin 0.1 the group of rewards 0.1 has advantages of exactly 0 and goes; at
    # margin 0 the same group of equal rewards has advantages of 0.1 and stays.
    with registered_advantage(MarginConfig, margin_advantages):
        metrics, _ = run_step(tmp_path, EqualNonZeroGroups(), filter_zero_advantage=True,
                              advantage={"type": "margin", "margin": margin}, **OVERRIDES)
    assert metrics["rollout/filtered_frac"] == dropped


@pytest.mark.parametrize("flag", ["filter_zero_advantage", "dynamic_sampling"])
def test_a_new_type_computed_in_the_trainer_is_refused_by_the_filters_in_one_line(flag):
    with registered_advantage(TokenToyConfig, lambda row: row.rewards), pytest.raises(ConfigError) as caught:
        build_config(OrchestratorConfig, ["--advantage.type", "token_toy", f"--{flag.replace('_', '-')}"])
    assert f"computed per token by the trainer: {flag} needs the orchestrator's advantages" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_old_names_of_the_kl_in_the_reward_are_refused_in_one_line():
    for typed in (["--advantage.type", "rloo"], []):  # without a type: the default type's section
        with pytest.raises(ConfigError) as caught:
            build_config(OrchestratorConfig, [*typed, "--advantage.kl-in-reward", "k3", "--advantage.kl-coef", "0.1"])
        assert "kl_in_reward is now reward_kl.estimator, kl_coef is now reward_kl.coef" in str(caught.value)
        assert "\n" not in str(caught.value)
    config, _ = build_config(OrchestratorConfig, ["--advantage.type", "grpo", "--advantage.reward-kl.estimator", "k3"])
    assert config.advantage.reward_kl.coef == 0.01 and config.advantage.batch_fields == ("sample_groups",)


class AllTruncated(ScriptedClient):
    """Every rollout is truncated: every reward is 0.1, every group's rewards equal."""

    async def chat(self, messages, n, *args, **kwargs):
        result = await super().chat(messages, n, *args, **kwargs)
        result.completions = [dataclasses.replace(c, finish_reason="length") for c in result.completions]
        return result


def test_a_step_without_any_learning_signal_says_so(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("prime_rl"), "propagate", True)  # whatever a setup_logging before did
    with caplog.at_level("WARNING", logger="prime_rl"):
        metrics, _ = run_step(tmp_path / "equal", AllTruncated(), **OVERRIDES)
    assert metrics["advantage/std"] == 0
    assert "step 0: every advantage is 0 (each group's rewards are equal): the step carries no learning signal" \
        in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="prime_rl"):
        run_step(tmp_path / "mixed", EqualNonZeroGroups(), **OVERRIDES)  # one group of equal rewards, one mixed
    assert "no learning signal" not in caplog.text

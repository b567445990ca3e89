"""Partial groups (`on_error = "exclude"`, the default): a failed rollout trains nothing and its group trains on the
rollouts left, with the baseline over those; a group left with one rollout is dropped (no baseline), and dynamic
sampling draws another; `on_error = "zero"` keeps the old rule (the failure trains as a 0)."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.envs import Example, Reward
from prime_rl.envs.environment import SyntheticEnvironment
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from tests.support.scripted_client import run_step

FLAKY = f"{__name__}:Flaky"
# Per request, the completions' texts: "ok" scores 1, "no" 0, "boom" makes the environment raise.
SCRIPT = [["ok", "no", "boom", "ok"], ["boom", "boom", "ok", "boom"], ["ok", "no", "no", "no"]]


class Flaky(SyntheticEnvironment):
    """Reverse-style prompts; `score` raises on "boom"."""

    id = "flaky"

    def make_example(self, rng):
        return Example([{"role": "user", "content": f"say ok {rng.random()}"}], "ok")

    async def score(self, example, completion):
        if completion == "boom":
            raise RuntimeError("the grader's sandbox is down")
        return Reward(1.0 if completion == "ok" else 0.0)


class ScriptClient:
    def __init__(self):
        self.calls = 0

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        texts = SCRIPT[self.calls % len(SCRIPT)]
        self.calls += 1
        completions = [RolloutCompletion([ord(c) % 90 for c in t] + [2], [-0.5] * (len(t) + 1), t, "stop")
                       for t in texts[:n]]
        return ChatResult([1] * 5, 0, completions)


def per_sample_advantages(batch) -> list[float]:
    """Each trained sample's advantage (its trained tokens all carry it), in batch order."""
    out = []
    for mb in batch.micro_batches:
        for a, m, trained in zip(mb.advantages.split(mb.sample_lens.tolist()), mb.loss_mask.split(
                mb.sample_lens.tolist()), mb.trained_samples, strict=True):
            if trained:
                out.append(float(a[m.bool()][0]))
    return out


def step(tmp_path, **overrides):
    return run_step(tmp_path, ScriptClient(), env=[{"id": FLAKY, **overrides.pop("env", {})}], **overrides)


def test_a_failed_rollout_trains_nothing_and_the_baseline_is_over_the_rest(tmp_path):
    metrics, batch = step(tmp_path)
    # Group 1: rewards 1, 0, (failed), 1: grpo over the 3 left (mean 2/3, sample std 1/sqrt(3)). Group 2 has one
    # rollout left: no baseline, dropped.
    s = math.sqrt(1 / 3) + 1e-6
    assert sorted(per_sample_advantages(batch)) == pytest.approx(sorted([(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s]))
    assert metrics["rollout/num_samples"] == 3
    assert metrics["rollout/unusable_groups"] == 1
    assert metrics["rollout/excluded_frac"] == pytest.approx(4 / 8)
    assert metrics["rollout/env_error_frac"] == pytest.approx(4 / 8)
    # The reward metrics count the rollouts that were scored: 1, 0, 1 and 1 (the failures' 0 is not a score).
    assert metrics["reward/mean"] == pytest.approx(3 / 4)


def test_dynamic_sampling_draws_a_group_in_place_of_one_left_without_a_baseline(tmp_path):
    metrics, batch = step(tmp_path, dynamic_sampling=True)
    # Round 1 refills the dropped group with request 3 (rewards 1, 0, 0, 0: four samples).
    assert metrics["rollout/num_samples"] == 3 + 4
    assert metrics["rollout/unusable_groups"] == 1


def test_on_error_zero_trains_a_failure_as_a_wrong_answer(tmp_path):
    metrics, batch = step(tmp_path, env={"on_error": "zero"})
    assert metrics["rollout/num_samples"] == 8 and metrics["rollout/excluded_frac"] == 0
    assert metrics["rollout/unusable_groups"] == 0
    advantages = per_sample_advantages(batch)
    # Group 1 as 4 rollouts (1, 0, 0, 1): +-0.5 / (sample std 1/sqrt(3)); the failed one is a negative advantage.
    s = math.sqrt(1 / 3) + 1e-6
    assert sorted(advantages[:4]) == pytest.approx(sorted([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]))
    assert torch.tensor(advantages).lt(0).sum() == 2 + 3

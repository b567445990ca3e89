"""The orchestrator drops (and dynamic sampling refills) groups of equal rewards whatever the reward value."""

from __future__ import annotations

import dataclasses

import pytest

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

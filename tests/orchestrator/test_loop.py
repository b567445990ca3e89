"""One orchestrator step against a scripted fake server: filtering, dynamic sampling, truncation."""

from __future__ import annotations

import pytest

from tests.support.scripted_client import ScriptedClient, run_step


def trained_samples(batch) -> int:
    return sum(mb.num_samples for mb in batch.micro_batches)


def test_no_filtering_keeps_every_group(tmp_path):
    metrics, batch = run_step(tmp_path, ScriptedClient())
    assert trained_samples(batch) == 8
    per_sample = [float(a.abs().max()) for mb in batch.micro_batches
                  for a, trained in zip(mb.advantages.split(mb.sample_lens.tolist()), mb.trained_samples, strict=True)
                  if trained]  # a shared prompt's root is a segment with no trained token
    assert sum(a == 0 for a in per_sample) == 4  # the all-wrong group has zero advantages, the mixed one not
    assert metrics["rollout/filtered_frac"] == 0.0 and metrics["reward/max"] == 1.0


def test_filter_zero_advantage_drops_uninformative_groups(tmp_path):
    metrics, batch = run_step(tmp_path, ScriptedClient(), filter_zero_advantage=True)
    assert trained_samples(batch) == 4
    assert metrics["rollout/filtered_frac"] == 0.5 and metrics["rollout/num_samples"] == 4


def test_dynamic_sampling_refills_the_batch(tmp_path):
    client = ScriptedClient()
    metrics, batch = run_step(tmp_path, client, dynamic_sampling=True)
    # Round 0: requests 1 (mixed) and 2 (wrong); round 1: request 3 (mixed) fills the batch.
    assert client.calls == 3 and metrics["rollout/num_samples"] == 8
    assert metrics["rollout/filtered_frac"] == pytest.approx(4 / 12)
    assert trained_samples(batch) == 8


def test_dynamic_sampling_cap(tmp_path):
    client = ScriptedClient()
    metrics, _ = run_step(tmp_path, client, dynamic_sampling=True, dynamic_sampling_max_rounds=0)
    assert client.calls == 2 and metrics["rollout/num_samples"] == 4


def test_mask_truncated_and_truncated_reward(tmp_path):
    metrics, batch = run_step(tmp_path / "mask", ScriptedClient(truncate_last=True), mask_truncated=True)
    assert metrics["rollout/truncated_frac"] == 0.25
    assert trained_samples(batch) == 6  # each group's truncated completion trains nothing
    metrics, _ = run_step(tmp_path / "penalty", ScriptedClient(truncate_last=True), truncated_reward=-1.0)
    assert metrics["reward/min"] == -1.0


def test_all_groups_filtered_gives_a_padding_batch(tmp_path):
    class AllWrong(ScriptedClient):
        async def chat(self, messages, n, *args, **kwargs):
            self.calls = 1  # even after increment: never mixed
            return await super().chat(messages, n, *args, **kwargs)

    metrics, batch = run_step(tmp_path, AllWrong(), filter_zero_advantage=True)
    assert metrics["rollout/filtered_frac"] == 1.0
    assert len(batch.micro_batches) == 1 and batch.micro_batches[0].num_loss_tokens == 0

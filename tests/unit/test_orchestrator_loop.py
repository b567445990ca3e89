"""One orchestrator step against a scripted fake server: filtering, dynamic sampling, truncation."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.orchestrator.ckpt import OrchestratorState
from prime_rl.orchestrator.client import ChatResult, Completion
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.utils.batch_format import read_rank


class ScriptedClient:
    """Odd-numbered requests get mixed completions (half right), even ones all wrong (zero advantage).

    Completion j of a request is truncated ('length') when j == n - 1 and `truncate_last` is set.
    """

    def __init__(self, truncate_last: bool = False):
        self.calls = 0
        self.truncate_last = truncate_last

    async def chat(self, messages, n, rule, max_tokens, seed=None):
        self.calls += 1
        answer = messages[-1]["content"][::-1]
        mixed = self.calls % 2 == 1
        completions = []
        for j in range(n):
            text = answer if mixed and j % 2 == 0 else "#"
            reason = "length" if self.truncate_last and j == n - 1 else "stop"
            ids = [ord(c) for c in text] + [2]
            completions.append(Completion(ids, [-0.5] * len(ids), text, reason))
        return ChatResult([1] * 5, 0, completions)

    async def update_weights(self, path, step):  # no weights directory exists in these tests
        raise AssertionError("unexpected weight update")


def run_step(tmp_path, client, **overrides):
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 8, "rollouts_per_example": 4, "seq_len": 64,
        "wandb": {"mode": "disabled"}, **overrides,
    })
    orch = Orchestrator(config, client, OrchestratorState())
    metrics = asyncio.run(orch.step(0))
    batch = read_rank(tmp_path, 0, 0)
    return metrics, batch


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

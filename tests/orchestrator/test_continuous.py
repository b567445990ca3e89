"""Continuous rollouts against a fake server whose weights change while requests decode.

The fake server samples one token at a time and encodes in each token id the weight step
it was sampled under (id = BASE + step), so the written batch files themselves show every
trained token's step: the lag bound is checked per token, on what the trainer would read.
"""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.batch_format import read_rank
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState
from prime_rl.run_dir import rollout_dir, weights_dir

BASE = 10  # token id = BASE + the weight step it was sampled under
TOKENS = 6  # completion length


class DecodingServer:
    """Serves weight step `step`; a request samples TOKENS tokens, `token_s` apart, each under the step
    current when it is sampled. Request number `stall` (if set) samples its first token, then waits until
    the server serves step `stall_until` before it samples the rest."""

    def __init__(self, token_s: float = 0.002, stall: int | None = None, stall_until: int = 0):
        self.step = 0
        self.token_s = token_s
        self.stall, self.stall_until = stall, stall_until
        self.calls = 0
        self.in_flight = 0
        self.updates: list[tuple[int, bool, int]] = []  # (step, in_flight flag, requests decoding then)
        self.reported: list[list[int]] = []  # every completion's token_weight_steps, as answered

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        self.calls += 1
        stalls = self.calls == self.stall
        admitted = self.step
        self.in_flight += 1
        steps: list[list[int]] = [[] for _ in range(n)]
        try:
            for i in range(TOKENS):
                await asyncio.sleep(self.token_s)
                while stalls and i == 1 and self.step < self.stall_until:
                    await asyncio.sleep(0.002)
                for s in steps:
                    s.append(self.step)
        finally:
            self.in_flight -= 1
        self.reported += steps
        completions = [RolloutCompletion([BASE + x for x in s], [-0.5] * TOKENS, "x" * j, "stop", list(s))
                       for j, s in enumerate(steps)]  # texts differ: rewards differ within a group
        return ChatResult([1, 2, 3, 4, 5], admitted, completions)

    async def update_weights(self, path, step, in_flight=False):
        self.updates.append((step, in_flight, self.in_flight))
        self.step = step
        return step


async def fake_trainer(output_dir, steps: int, train_s: float) -> None:
    """Writes weights/step_{k+1} `train_s` after rollouts/step_k appears."""
    for k in range(steps):
        while not rollout_dir(output_dir, k).is_dir():
            await asyncio.sleep(0.002)
        await asyncio.sleep(train_s)
        weights_dir(output_dir, k + 1).mkdir(parents=True)


def run(tmp_path, server: DecodingServer, steps: int, train_s: float, **overrides):
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 16, "rollouts_per_example": 4, "seq_len": 256,
        "rollout_mode": "continuous", "client": {"max_concurrency": 6}, "max_steps": steps,
        "wandb": {"mode": "disabled"}, **overrides,
    })

    async def scenario():
        orch = Orchestrator(config, server, OrchestratorState())
        trainer = asyncio.create_task(fake_trainer(tmp_path, steps, train_s))
        metrics, at_boundary = [], []
        try:
            for step in range(steps):
                metrics.append(await orch.step(step))
                at_boundary.append(orch.collector.in_flight)
        finally:
            await orch.collector.stop()
            trainer.cancel()
        return metrics, at_boundary

    metrics, at_boundary = asyncio.run(scenario())
    return config, metrics, at_boundary


def trained_token_steps(tmp_path, step: int) -> list[tuple[int, list[int]]]:
    """(policy_step, the weight steps of its trained tokens) of every trained sample of a written batch."""
    out = []
    for mb in read_rank(tmp_path, step, 0).micro_batches:
        starts = (mb.sample_lens.cumsum(0) - mb.sample_lens).tolist()
        for start, length, policy_step in zip(starts, mb.sample_lens.tolist(), mb.policy_step.tolist(), strict=True):
            ids = mb.input_ids[start:start + length][mb.loss_mask[start:start + length]]
            if len(ids):
                out.append((policy_step, [int(i) - BASE for i in ids]))
    return out


@pytest.mark.parametrize("max_async_level", [0, 1, 2])
@pytest.mark.parametrize("train_s", [0.0, 0.03])  # a trainer faster and slower than generation
def test_no_trained_token_is_older_than_max_async_level(tmp_path, max_async_level, train_s):
    server = DecodingServer()
    steps = 6
    _, metrics, _ = run(tmp_path, server, steps, train_s, max_async_level=max_async_level)
    for step in range(steps):
        samples = trained_token_steps(tmp_path, step)
        assert len(samples) == 16
        for policy_step, token_steps in samples:
            assert all(0 <= step - s <= max_async_level for s in token_steps), (step, token_steps)
            assert policy_step == min(token_steps)  # a sample's policy_step is its oldest token's step
        lags = [step - s for _, token_steps in samples for s in token_steps]
        assert metrics[step]["async/token_lag_max"] == max(lags) <= max_async_level
        assert metrics[step]["async/token_lag_mean"] == pytest.approx(sum(lags) / len(lags))
    # Every update was in flight, and the steps in the batches are those the server reported.
    assert server.updates and all(flag for _, flag, _ in server.updates)
    written = sorted(s for step in range(steps) for _, token_steps in trained_token_steps(tmp_path, step)
                     for s in token_steps)
    reported = sorted(s for steps_ in server.reported for s in steps_)
    assert set(written) <= set(reported)


def test_weights_change_while_requests_decode_and_requests_cross_step_boundaries(tmp_path):
    server = DecodingServer(token_s=0.003)
    _, metrics, at_boundary = run(tmp_path, server, 12, 0.0, max_async_level=2)
    assert any(decoding for _, _, decoding in server.updates), "no update landed while requests decoded"
    assert any(len(set(steps)) > 1 for steps in server.reported), "no completion spans two weight steps"
    assert any(at_boundary[:-1]), "the producer drained at every step boundary"
    assert all(0 <= m["async/inference_idle_frac"] <= 1 for m in metrics)


def test_a_group_too_old_for_its_batch_is_dropped_and_counted(tmp_path):
    # Request 1 samples its first token under step 0, then stalls until the server serves step 3: its group
    # finishes for batch 3 or later, with a token 3 steps old.
    server = DecodingServer(token_s=0.002, stall=1, stall_until=3)
    _, metrics, _ = run(tmp_path, server, 6, 0.0, max_async_level=1)
    assert sum(m["async/stale_groups"] for m in metrics) >= 1
    for step in range(6):
        assert all(step - s <= 1 for _, token_steps in trained_token_steps(tmp_path, step) for s in token_steps)


def test_continuous_mode_rejects_dynamic_sampling():
    with pytest.raises(ValueError, match="use filter_zero_advantage"):
        OrchestratorConfig.build(overrides={"rollout_mode": "continuous", "dynamic_sampling": True})


class TiedServer(DecodingServer):
    """Every completion of a group is the same: every group's advantages are zero."""

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        result = await super().chat(messages, n, rule, max_tokens, seed)
        for completion in result.completions:
            completion.text = "same"
        return result


def test_filtering_a_task_where_every_group_ties_ends_each_step_with_an_empty_batch(tmp_path, caplog):
    """filter_zero_advantage refills the batch, but only up to 1 + dynamic_sampling_max_rounds batches' worth
    of finished groups: a task where every group ties must not draw prompts forever."""
    server = TiedServer()
    _, metrics, _ = run(tmp_path, server, 2, 0.0, filter_zero_advantage=True, dynamic_sampling_max_rounds=2)
    needed = 16 // 4
    for step in range(2):
        assert metrics[step]["rollout/num_samples"] == 0 and metrics[step]["rollout/filtered_frac"] == 1
        assert trained_token_steps(tmp_path, step) == []
    assert server.calls <= 2 * needed * 3 + 6  # two steps' looks plus what was in flight at the end
    assert "held only 0/4 that can train" in caplog.text


class EvalRecordingServer(DecodingServer):
    """Records the weight step each evaluation request (n = 1) was admitted under."""

    def __init__(self):
        super().__init__()
        self.eval_steps: list[int] = []

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        if n == 1:
            self.eval_steps.append(self.step)
        return await super().chat(messages, n, rule, max_tokens, seed)


def test_evaluation_keeps_the_lag_bound(tmp_path):
    server = EvalRecordingServer()
    steps = 4
    run(tmp_path, server, steps, 0.01, max_async_level=0, eval={"interval": 1, "num_examples": 2, "rollouts": 1})
    assert server.eval_steps == [step for step in range(steps) for _ in range(2)]  # on-policy: step n's weights

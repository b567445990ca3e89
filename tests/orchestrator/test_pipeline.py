"""`run_steps`: step n's finish (the teacher's scoring, packing, writing) runs while step n + 1 generates."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.batch_format import read_rank
from prime_rl.orchestrator.client import ChatResult, InferenceError, RolloutCompletion
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.orchestrator import Orchestrator, run_steps
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState, load_state, rng_to_json

REQUESTS_PER_STEP = 2  # batch_size 8 / rollouts_per_example 4


class Client:
    """Answers every request at once (half the completions right); `block_from` (a request number) makes that
    request and later ones wait forever, `fail_from` makes them raise."""

    def __init__(self, block_from: int | None = None, fail_from: int | None = None):
        self.requests = 0
        self.block_from, self.fail_from = block_from, fail_from

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        self.requests += 1
        if self.fail_from is not None and self.requests >= self.fail_from:
            raise InferenceError("generation: server gone")
        if self.block_from is not None and self.requests >= self.block_from:
            await asyncio.Event().wait()
        answer = messages[-1]["content"][::-1]
        completions = []
        for j in range(n):
            ids = [ord(c) % 90 for c in (answer if j % 2 == 0 else "#")] + [2]  # in the char vocabulary
            completions.append(RolloutCompletion(ids, [-0.5] * len(ids), "", "stop"))
        return ChatResult([1] * 5, 0, completions)

    async def update_weights(self, path, step):  # max_async_level covers every step: no update
        raise AssertionError("unexpected weight update")


class Teacher:
    """Sets every sample's teacher fields; `gate(step)` is awaited inside the scoring of `step`."""

    def __init__(self, gate):
        self.gate = gate
        self.scored = 0

    async def apply(self, samples, temperature):
        for s in samples:
            s.teacher_logprobs = [0.0] * len(s.completion_ids)
            s.token_advantages = [s.advantage] * len(s.completion_ids)
        step = self.scored
        self.scored += 1
        await self.gate(step)
        return {"perf/teacher_s": 0.0}


class Monitor:
    def __init__(self):
        self.steps = []

    def log(self, metrics, step):
        self.steps.append(step)


def orchestrator(tmp_path, client, teacher=None, **overrides) -> Orchestrator:
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 8, "rollouts_per_example": 4, "seq_len": 64, "max_steps": 3,
        "max_async_level": 3, "wandb": {"mode": "disabled"}, **overrides,
    })
    return Orchestrator(config, client, OrchestratorState(), teacher)


def run(orch: Orchestrator, monitor: Monitor, timeout: float = 20.0) -> None:
    asyncio.run(asyncio.wait_for(run_steps(orch, monitor, 0), timeout))


def test_the_teacher_scores_step_n_while_step_n_plus_1_generates(tmp_path):
    client = Client()

    async def next_step_generating(step):  # deadlocks (the timeout fails the test) unless the steps overlap
        while step < 2 and client.requests <= REQUESTS_PER_STEP * (step + 1):
            await asyncio.sleep(0.001)

    monitor = Monitor()
    run(orchestrator(tmp_path, client, Teacher(next_step_generating)), monitor)
    assert monitor.steps == [0, 1, 2]  # finished and logged in order
    for step in range(3):
        assert sum(mb.num_samples for mb in read_rank(tmp_path, step, 0).micro_batches) == 8


def test_a_teacher_failure_ends_the_run_while_the_next_step_waits_forever(tmp_path):
    async def fail(step):
        raise InferenceError("teacher: connection refused")

    orch = orchestrator(tmp_path, Client(block_from=REQUESTS_PER_STEP + 1), Teacher(fail))
    with pytest.raises(InferenceError, match="teacher: connection refused"):  # itself, not an ExceptionGroup
        run(orch, Monitor())
    assert not (tmp_path / "rollouts" / "step_0").exists()


def test_a_generation_failure_ends_the_run_while_the_teacher_scores(tmp_path):
    async def slow(step):
        await asyncio.sleep(3600)

    with pytest.raises(InferenceError, match="generation: server gone"):
        run(orchestrator(tmp_path, Client(fail_from=REQUESTS_PER_STEP + 1), Teacher(slow)), Monitor())


def test_a_checkpoint_holds_the_draws_of_its_steps_not_of_the_step_generating_meanwhile(tmp_path):
    async def after_next_step_drew(step):
        while step < 2 and client.requests <= REQUESTS_PER_STEP * (step + 1):
            await asyncio.sleep(0.001)

    client = Client()
    orch = orchestrator(tmp_path / "pipelined", client, Teacher(after_next_step_drew), ckpt={"interval": 1})
    run(orch, Monitor())
    sequential = orchestrator(tmp_path / "sequential", Client(), Teacher(lambda step: asyncio.sleep(0)))
    for step in range(3):
        asyncio.run(sequential.step(step))
        saved = load_state(tmp_path / "pipelined", step + 1)
        assert saved.step == step + 1
        assert saved.env_cursors == sequential.source.cursors
        assert saved.rng_state == rng_to_json(sequential.source.rng)

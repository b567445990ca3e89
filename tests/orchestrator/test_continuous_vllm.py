"""Continuous rollouts against vLLM's stand-in behind prime-rl's middleware (`tests/support/fake_vllm.py`), through
the orchestrator's own client: weights load in flight through the middleware (vLLM paused with mode "keep", each
token's step from the engine's weight-version spans; or, with `in_flight_kv = "resubmit"`, the running requests
aborted and the client sending the rest again), and with an artificially slow environment the groups that finish
too late for their batch are dropped, never trained, and counted in `async/stale_groups`."""

from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import urlsplit

import pytest
import torch
from safetensors.torch import save_file

from prime_rl.batch_format import read_rank
from prime_rl.envs import Example, Reward
from prime_rl.envs.environment import SyntheticEnvironment
from prime_rl.inference.vllm.middleware import IN_FLIGHT_KV_ENV
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.orchestrator.client import InferenceClient, InferenceError
from prime_rl.orchestrator.config import ClientConfig, OrchestratorConfig
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState
from prime_rl.run_dir import rollout_dir, weights_dir
from tests.support.fake_vllm import FakeEngineClient, app_client, fake_vllm_app, token_ids, weight_dir

SLOW_S = 1.2  # how long the slow environment scores every 4th example


class SlowEveryFourth(SyntheticEnvironment):
    """Example k asks for "ABCDEF"; scoring it takes SLOW_S when k % 4 == 3 (a slow grader), else no time."""

    id = "slow-every-fourth"

    def __init__(self):
        self.scored: list[bool] = []  # per scored completion: was it a slow one

    def make_example(self, rng):
        return Example([{"role": "user", "content": "say ABCDEF"}], "ABCDEF", {"k": rng.random()})

    async def score(self, example, completion):
        slow = int(example.info["k"] * 1000) % 4 == 3
        if slow:
            await asyncio.sleep(SLOW_S)
        self.scored.append(slow)
        return Reward(float(len(completion)) / 6 if completion else 0.0)


class AppClient(InferenceClient):
    """The orchestrator's client, its HTTP requests served in-process by the stand-in app."""

    def __init__(self, app):
        super().__init__(ClientConfig())
        self.http = app_client(app)

    async def _request(self, method, url, payload=None):
        answer = await self.http.request(method, urlsplit(url).path, json=payload)
        if answer.status_code != 200:
            raise InferenceError(f"inference server answered {answer.status_code} to {url}: {answer.text}")
        return answer.json()


async def fake_trainer(output_dir, steps: int) -> None:
    """Writes a fitting weights/step_{k+1} (atomically) as soon as rollouts/step_k appears."""
    for k in range(steps):
        while not rollout_dir(output_dir, k).is_dir():
            await asyncio.sleep(0.005)
        target = weights_dir(output_dir, k + 1)
        staging = target.parent / f".{target.name}.tmp"
        staging.mkdir(parents=True)
        (staging / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 1}))
        save_file({"w": torch.zeros(1)}, str(staging / "model.safetensors"))
        os.rename(staging, target)


@pytest.mark.parametrize("in_flight_kv", ["keep", "resubmit"])
@pytest.mark.slow
def test_groups_too_old_for_their_batch_are_dropped_and_counted_on_vllm(tmp_path, monkeypatch, in_flight_kv):
    output_dir = tmp_path / "run"
    served = weight_dir(tmp_path, 0)
    access = AccessPolicy(weight_roots=(output_dir.resolve(),), model_dir=str(served))
    for name, value in access.to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(IN_FLIGHT_KV_ENV, in_flight_kv)
    engine = FakeEngineClient(answer="ABCDEF", token_s=0.01)  # ids < the tokenizer's 99
    app, _ = fake_vllm_app(engine)
    steps, lag = 10, 1
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(output_dir), "batch_size": 8, "rollouts_per_example": 2, "seq_len": 64,
        "rollout_mode": "continuous", "client": {"max_concurrency": 4}, "max_steps": steps, "max_async_level": lag,
        "filter_zero_advantage": False,
        "env": [{"id": f"{__name__}:SlowEveryFourth"}], "wandb": {"mode": "disabled"},
    })

    async def scenario():
        orch = Orchestrator(config, AppClient(app), OrchestratorState())
        trainer = asyncio.create_task(fake_trainer(output_dir, steps))
        try:
            return [await orch.step(step) for step in range(steps)], orch.source.envs["slow-every-fourth"].scored
        finally:
            await orch.collector.stop()
            trainer.cancel()

    metrics, scored = asyncio.run(scenario())
    stale = sum(m["async/stale_groups"] for m in metrics)
    assert stale >= 1, "no group finished too late for its batch"
    # Every trained sample's oldest token is within the bound of its batch, read from the batch files.
    for step in range(steps):
        policy_steps = [int(s) for mb in read_rank(output_dir, step, 0).micro_batches for s, trained in
                        zip(mb.policy_step.tolist(), mb.trained_samples, strict=True) if trained]
        assert len(policy_steps) == 8 and all(step - s <= lag for s in policy_steps), (step, policy_steps)
    # The weights were loaded in flight through the middleware (vLLM paused with mode "keep"), labelled by step, or
    # after aborting the running requests, whose rest the client sent again (completions of the prompt + tokens so
    # far): every trained completion is whole ("ABCDEF", 6 tokens, read from the batch files).
    assert engine.versions
    if in_flight_kv == "keep":
        assert ("pause_generation", ("keep", False)) in engine.calls
    else:
        assert ("pause_generation", ("abort", False)) in engine.calls
        assert not any(call[1][0] == "keep" for call in engine.calls if call[0] == "pause_generation")
        resubmitted = [body for body in app.state.generated if "prompt" in body]
        prompt = token_ids("say ABCDEF")
        assert resubmitted and all(body["prompt"][:len(prompt)] == prompt for body in resubmitted)
        assert any(len(body["prompt"]) > len(prompt) for body in resubmitted)  # some were aborted after a token
    for step in range(steps):
        for mb in read_rank(output_dir, step, 0).micro_batches:
            lengths = torch.segment_reduce(mb.loss_mask.float(), "sum", lengths=mb.sample_lens)
            assert all(int(n) == 6 for n, trained in zip(lengths, mb.trained_samples, strict=True) if trained)
    # Each finished group was trained, dropped as stale, or is still unconsumed: none is trained twice or lost.
    trained_groups = steps * 8 // 2
    assert len(scored) // 2 >= trained_groups + stale

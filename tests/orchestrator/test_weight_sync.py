"""Weight sync (async bound, waits, leftovers), response parsing, checkpoint selection."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from prime_rl.orchestrator.client import InferenceError, parse_chat_response, server_root
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState, load_state, save_state
from prime_rl.orchestrator.weight_sync import WeightSync, min_weight_step
from prime_rl.run_dir import resolve_resume_step
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import WaitTimeout


class FakeClient:
    def __init__(self):
        self.loaded: list[int] = []

    async def update_weights(self, path: str, step: int, in_flight: bool = False) -> int:
        assert path.endswith(f"step_{step}")
        self.loaded.append(step)
        return step


def make_weights(output_dir, step, age_s: float = 0.0):
    path = output_dir / "weights" / f"step_{step}"
    path.mkdir(parents=True)
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def test_min_weight_step():
    assert [min_weight_step(n, 1) for n in range(4)] == [0, 0, 1, 2]
    assert [min_weight_step(n, 0) for n in range(3)] == [0, 1, 2]


def test_ensure_loads_the_newest_and_waits_only_below_the_bound(tmp_path):
    client = FakeClient()
    sync = WeightSync(client, tmp_path, max_async_level=1, timeout_s=10, poll_s=0.01)

    async def scenario():
        assert await sync.ensure(1) < 0.05 and client.loaded == []  # step 1 may use weights 0
        make_weights(tmp_path, 1)
        make_weights(tmp_path, 2)
        make_weights(tmp_path, 5)  # newer than the step being generated: never used
        await sync.ensure(2)
        assert client.loaded == [2] and sync.served_step == 2

        async def trainer():
            await asyncio.sleep(0.2)
            make_weights(tmp_path, 3)

        task = asyncio.create_task(trainer())
        waited = await sync.ensure(4)  # needs >= 3
        await task
        assert waited >= 0.15 and client.loaded == [2, 3]

    asyncio.run(scenario())


def test_ensure_times_out_with_a_clear_error(tmp_path):
    sync = WeightSync(FakeClient(), tmp_path, max_async_level=0, timeout_s=0.2, poll_s=0.01)
    with pytest.raises(WaitTimeout, match=r"waiting for the trainer's weights step >= 1 .* max_async_level 0"):
        asyncio.run(sync.ensure(1))


def test_leftover_weights_of_a_previous_run_are_ignored_after_resume(tmp_path):
    make_weights(tmp_path, 2, age_s=60)
    make_weights(tmp_path, 3, age_s=60)  # written by the old run beyond the resume step
    client = FakeClient()
    sync = WeightSync(client, tmp_path, max_async_level=1, timeout_s=10, trusted_upto=2)
    asyncio.run(sync.ensure(3))
    assert client.loaded == [2]


def chat_body(n_choices=2):
    choice = {"index": 0, "token_ids": [5, 6], "finish_reason": "length", "message": {"content": "ab"},
              "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.0}]}}
    return {"prompt_token_ids": [1, 2, 3], "weight_step": 4, "choices": [choice] * n_choices}


def test_parse_chat_response():
    result = parse_chat_response(chat_body(), 2)
    assert result.prompt_token_ids == [1, 2, 3] and result.weight_step == 4
    assert result.completions[0].logprobs == [-0.5, -1.0] and result.completions[0].truncated
    with pytest.raises(InferenceError, match="asked the inference server for 3 completions, got 2"):
        parse_chat_response(chat_body(), 3)
    broken = chat_body()
    del broken["prompt_token_ids"]
    with pytest.raises(InferenceError, match="malformed chat completion"):
        parse_chat_response(broken, 2)
    assert server_root("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"


def test_checkpoint_round_trip_and_latest(tmp_path):
    for step in (1, 2, 3):
        save_state(tmp_path, OrchestratorState(step, {"reverse-text": step * 4}, None), keep=1)
    # The orchestrator never runs without a trainer: before the trainer's first checkpoint nothing is complete,
    # so nothing is pruned (the trainer may be writing that first checkpoint into step_1 right now).
    assert (tmp_path / "checkpoints" / "step_1" / "orchestrator").exists()
    assert load_state(tmp_path, 3).env_cursors == {"reverse-text": 12}
    assert resolve_resume_step(tmp_path, "latest") == 3  # judged by the parts found: a run by hand
    # With trainer checkpoints present, 'latest' is the newest step both have, and older steps go.
    (tmp_path / "checkpoints" / "step_2" / "trainer").mkdir()
    assert resolve_resume_step(tmp_path, "latest") == 2
    (tmp_path / "checkpoints" / "step_3" / "trainer").mkdir()
    save_state(tmp_path, OrchestratorState(4, {"reverse-text": 16}, None), keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_3", "step_4"]
    assert resolve_resume_step(tmp_path, None) is None
    with pytest.raises(UserError, match=r"resume_step = 7: no complete checkpoint .* \(complete steps: 3\)"):
        resolve_resume_step(tmp_path, 7)

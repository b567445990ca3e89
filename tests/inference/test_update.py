"""The one `/update_weights` flow every backend serves (`inference/update.py`), with a scripted loader: the status
of every outcome, nothing held before the update is staged, the old step kept when a load fails, and the step a
loader stages (a transfer marker's newest) is the one served."""

from __future__ import annotations

import asyncio
import json

import pytest

from prime_rl.inference.gate import WeightGate
from prime_rl.inference.update import update_weights
from prime_rl.openai_api.protocol import UpdateWeightsRequest
from prime_rl.utils.errors import UserError


class Loader:
    def __init__(self, in_flight=True, stage_error=None, apply_error=None, staged_step=None):
        self.in_flight, self.stage_error, self.apply_error, self.staged_step = (
            in_flight, stage_error, apply_error, staged_step)
        self.applied = []

    async def stage(self, weights, step):
        if self.stage_error:
            raise self.stage_error
        return (self.staged_step if self.staged_step is not None else step), f"weights of {weights.path.name}"

    async def apply(self, staged, step):
        if self.apply_error:
            raise self.apply_error
        self.applied.append((staged, step))


def weights(root, step=3):
    path = root / f"step_{step}"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def run(loader, path, roots, gate=None, **fields):
    gate = gate or WeightGate(step=1, timeout_s=0.2)
    status, payload = asyncio.run(update_weights(UpdateWeightsRequest(path=str(path), **fields), loader, roots, gate))
    return status, payload, gate


def test_a_staged_update_is_applied_and_its_step_served(tmp_path):
    loader = Loader(staged_step=5)  # e.g. a marker whose newest transferred weights are of step 5
    status, payload, gate = run(loader, weights(tmp_path), [tmp_path])
    assert (status, payload, gate.step) == (200, {"weight_step": 5}, 5)
    assert loader.applied == [("weights of step_3", 5)]


@pytest.mark.parametrize(("case", "status", "message"), [
    ("outside the roots", 403, "outside the allowed weight directories"),
    ("no such directory", 400, "does not exist"),
    ("in flight unsupported", 400, "in-flight weight update refused: the backend cannot swap weights under requests"),
    ("stage refuses", 400, "shapes differ"),
    ("apply fails", 400, "cannot load weights from"),
])
def test_every_refusal_has_its_status_and_one_line_and_keeps_the_served_step(tmp_path, case, status, message):
    path, roots, loader, fields = weights(tmp_path / "w"), [tmp_path / "w"], Loader(), {}
    if case == "outside the roots":
        roots = [tmp_path / "elsewhere"]
    elif case == "no such directory":
        path = tmp_path / "w" / "step_9"
    elif case == "in flight unsupported":
        loader, fields = Loader(in_flight=False), {"in_flight": True}
    elif case == "stage refuses":
        loader = Loader(stage_error=UserError("shapes differ from the served model"))
    else:
        loader = Loader(apply_error=RuntimeError("size mismatch for lm_head.weight\nlong traceback text"))
    got, payload, gate = run(loader, path, roots, **fields)
    assert got == status and message in payload["error"]["message"], payload
    assert "\n" not in payload["error"]["message"] and payload["error"]["code"] == status
    assert gate.step == 1 and loader.applied == []


def test_a_gate_that_cannot_drain_in_time_is_a_503(tmp_path):
    gate = WeightGate(step=1, timeout_s=0.1)

    async def scenario():
        async with gate.request():  # a request that never finishes holds the drain
            return await update_weights(UpdateWeightsRequest(path=str(weights(tmp_path))), Loader(), [tmp_path], gate)

    status, payload = asyncio.run(scenario())
    assert status == 503 and "timed out" in payload["error"]["message"] and gate.step == 1

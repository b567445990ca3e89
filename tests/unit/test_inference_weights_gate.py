"""Weight directories and the weight gate (which weights serve which request)."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.weights import check_weight_dir
from prime_rl.utils.errors import UserError


def _weights(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_step_comes_from_the_directory_name(tmp_path):
    assert check_weight_dir(_weights(tmp_path / "weights" / "step_12")) == (tmp_path / "weights" / "step_12", 12)
    assert check_weight_dir(_weights(tmp_path / "final"), step=3)[1] == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "file").write_text("x") and p / "file", "is not a directory"),
        (lambda p: (p / "step_1").mkdir() or p / "step_1", "is not a weight directory"),
        (lambda p: _weights(p / "latest"), "cannot tell the weight step"),
    ],
)
def test_bad_weight_dirs_are_named(tmp_path, make, message):
    with pytest.raises(UserError, match=message):
        check_weight_dir(make(tmp_path))


def test_update_waits_for_in_flight_requests_and_holds_new_ones():
    async def scenario():
        gate = WeightGate(step=0, timeout_s=5)
        events = []
        release = asyncio.Event()

        async def old_request():
            async with gate.request() as step:
                events.append(("old starts", step))
                await release.wait()
                events.append(("old ends", step))

        async def update():
            async with gate.update(1):
                events.append(("load", gate.active))

        async def new_request():
            async with gate.request() as step:
                events.append(("new", step))

        tasks = [asyncio.create_task(old_request())]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(update()))
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(new_request()))
        await asyncio.sleep(0.01)
        assert events == [("old starts", 0)]  # the update waits, the new request waits behind it
        release.set()
        await asyncio.gather(*tasks)
        return events, gate.step

    events, step = asyncio.run(scenario())
    assert events == [("old starts", 0), ("old ends", 0), ("load", 0), ("new", 1)]
    assert step == 1


def test_failed_update_keeps_the_step_and_timeouts_are_errors():
    async def scenario():
        gate = WeightGate(step=4, timeout_s=0.05)
        with pytest.raises(RuntimeError):
            async with gate.update(5):
                raise RuntimeError("load failed")
        assert gate.step == 4
        async with gate.request():
            with pytest.raises(GateTimeout, match="in-flight requests"):
                async with gate.update(6):
                    pass
        assert gate.step == 4
        async with gate.request() as step:  # the gate reopened after the timeout
            assert step == 4

    asyncio.run(scenario())

"""Weight directories and the weight gate (which weights serve which request)."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.weight_dirs import WeightPathForbidden
from prime_rl.openai_api.access import resolve_roots
from prime_rl.utils.errors import UserError
from tests.support.weight_dirs import check_weight_dir


def _weights(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_step_comes_from_the_directory_name(tmp_path):
    roots = (tmp_path,)
    assert check_weight_dir(_weights(tmp_path / "weights" / "step_12"), None, roots) == (
        tmp_path / "weights" / "step_12", 12)
    assert check_weight_dir(_weights(tmp_path / "final"), 3, roots)[1] == 3


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "file").write_text("x") and p / "file", "is not a directory"),
        (lambda p: (p / "step_1").mkdir() or p / "step_1", "is not a weight directory"),
        (lambda p: _weights(p / "latest"), "cannot tell the weight step"),
        (lambda p: f"{p}/step_1\x00", "invalid weight path"),
    ],
)
def test_bad_weight_dirs_are_named(tmp_path, make, message):
    with pytest.raises(UserError, match=message):
        check_weight_dir(make(tmp_path), None, (tmp_path,))


def test_only_directories_under_an_allowed_root_load_judged_after_symlinks(tmp_path):
    root = tmp_path / "run" / "weights"
    inside = _weights(root / "step_1")
    outside = _weights(tmp_path / "elsewhere" / "step_2")
    (root / "step_3").symlink_to(outside)  # a link inside the root that leads out
    (tmp_path / "link_to_root").symlink_to(root)  # a link outside that leads in
    roots = resolve_roots([root], None)
    assert check_weight_dir(inside, None, roots) == (inside, 1)
    assert check_weight_dir(tmp_path / "link_to_root" / "step_1", None, roots) == (inside, 1)
    for path in (outside, root / "step_3", f"{root}/step_1/../../../elsewhere/step_2", "/etc", tmp_path / "run"):
        with pytest.raises(WeightPathForbidden, match="outside the allowed weight directories"):
            check_weight_dir(path, None, roots)
    # Refused before anything about the path is looked at: a missing path outside is 403, not "does not exist".
    with pytest.raises(WeightPathForbidden):
        check_weight_dir(tmp_path / "nope" / "step_1", None, roots)
    with pytest.raises(WeightPathForbidden, match="no weight directory is allowed"):
        check_weight_dir(inside, None, ())


def test_roots_are_resolved_at_start_and_include_the_model_directory(tmp_path, monkeypatch):
    model = _weights(tmp_path / "model")
    (tmp_path / "alias").symlink_to(tmp_path / "run")
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path)
    roots = resolve_roots(["alias/weights"], str(model))  # relative, through a link, not yet created
    assert roots == (tmp_path.resolve() / "run" / "weights", model.resolve())
    assert check_weight_dir(model, 0, roots) == (model.resolve(), 0)  # the initial model reloads as step 0
    assert resolve_roots([], "Qwen/Qwen3-0.6B") == ()  # a hub name is no directory


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


def test_in_flight_update_neither_waits_for_nor_holds_requests_but_waits_for_other_updates():
    async def scenario():
        gate = WeightGate(step=0, timeout_s=5)
        events = []
        release_request, release_update = asyncio.Event(), asyncio.Event()

        async def old_request():
            async with gate.request() as step:
                events.append(("old starts", step))
                await release_request.wait()
                events.append(("old ends", step))

        async def update(step, drain, release=None):
            async with gate.update(step, drain=drain):
                events.append(("load", step, gate.active))
                if release is not None:
                    await release.wait()

        async def new_request():
            async with gate.request() as step:
                events.append(("new", step))

        old = asyncio.create_task(old_request())
        await asyncio.sleep(0.01)
        await update(1, drain=False)  # applied while the old request runs
        await new_request()  # admitted at once, under the new step
        assert events == [("old starts", 0), ("load", 1, 1), ("new", 1)]
        # A second in-flight update waits for a running one (updates never overlap).
        first = asyncio.create_task(update(2, drain=False, release=release_update))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(update(3, drain=False))
        await asyncio.sleep(0.01)
        assert events[-1] == ("load", 2, 1) and gate.step == 1
        await asyncio.wait_for(new_request(), 1)  # admitted while an in-flight update runs, under the served step
        assert events[-1] == ("new", 1)
        release_update.set()
        await asyncio.gather(first, second)
        release_request.set()
        await old
        return events, gate.step

    events, step = asyncio.run(scenario())
    assert events[-2:] == [("load", 3, 1), ("old ends", 0)] and step == 3


def test_a_hurried_drain_calls_hurry_until_the_running_requests_end_and_never_interrupts_it():
    """vLLM's abort (`vllm/abort.py`): called at once and again every HURRY_S while requests run (a request that ends
    meanwhile waits for the call in progress to return); new requests wait; none is called once drained."""
    async def scenario():
        gate = WeightGate(step=0, timeout_s=5)
        events, remaining = [], [3]
        release = asyncio.Event()

        async def hurry():
            events.append("hurry starts")
            await asyncio.sleep(0.01)
            remaining[0] -= 1
            if remaining[0] == 0:
                release.set()  # the running request ends while this call is not done yet
            await asyncio.sleep(0.01)
            events.append("hurry ends")

        async def running():
            async with gate.request():
                await release.wait()
            events.append("request ends")

        async def update():
            async with gate.update(1, hurry=hurry):
                events.append(("load", gate.active))

        async def new_request():
            async with gate.request() as step:
                events.append(("new", step))

        tasks = [asyncio.create_task(running())]
        await asyncio.sleep(0.01)
        tasks += [asyncio.create_task(update())]
        await asyncio.sleep(0.005)
        tasks += [asyncio.create_task(new_request())]
        await asyncio.gather(*tasks)
        return events

    events = asyncio.run(scenario())
    assert events == ["hurry starts", "hurry ends"] * 3 + ["request ends", ("load", 0), ("new", 1)]


def test_a_hurry_that_fails_fails_the_update_and_reopens_the_gate():
    async def scenario():
        gate = WeightGate(step=2, timeout_s=5)

        async def hurry():
            raise RuntimeError("vLLM could not pause")

        release = asyncio.Event()

        async def running():
            async with gate.request():
                await release.wait()

        task = asyncio.create_task(running())
        await asyncio.sleep(0.01)
        with pytest.raises(RuntimeError, match="could not pause"):
            async with gate.update(3, hurry=hurry):
                pass
        async with gate.request() as step:  # not held, the step unchanged
            assert step == 2
        release.set()
        await task
        async with gate.update(3, hurry=hurry):  # nothing runs: nothing to hurry
            pass
        return gate.step

    assert asyncio.run(scenario()) == 3


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

            async def hurry():  # it ends nothing
                pass

            with pytest.raises(GateTimeout, match="in-flight requests"):
                async with gate.update(6, hurry=hurry):
                    pass
        assert gate.step == 4
        async with gate.request() as step:  # the gate reopened after the timeout
            assert step == 4

    asyncio.run(scenario())


def test_an_in_flight_update_never_goes_back_but_a_draining_one_may():
    """Running requests' tokens record non-decreasing steps; a draining update (no request spans it) may reload
    an older step, as `WeightSync.align` does when the server serves a leftover of another run."""
    async def scenario():
        gate = WeightGate(step=7)
        with pytest.raises(UserError, match="cannot go back from step 7 to 5"):
            async with gate.update(5, drain=False):
                pytest.fail("the swap must not run")
        assert gate.step == 7
        async with gate.update(7, drain=False):  # the same step again is no step back
            pass
        async with gate.update(5):
            pass
        assert gate.step == 5
        async with gate.update(6, drain=False):  # the gate is free again after the refusal
            pass
        return gate.step

    assert asyncio.run(scenario()) == 6


def _in_thread(function, *args, timeout_s: float = 10.0):
    """Run `function(*args)` in a daemon thread; its exception, or a failure if it hangs (a FIFO blocks open())."""
    import threading

    outcome: list = []

    def target():
        try:
            outcome.append(function(*args))
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert outcome, f"{function.__name__} hung for {timeout_s} s"
    return outcome[0]


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_in_a_weight_dir_is_refused_without_blocking(tmp_path, name):
    import os

    path = _weights(tmp_path / "step_1")
    (path / name).unlink()
    os.mkfifo(path / name)
    error = _in_thread(check_weight_dir, path, None, (tmp_path,))
    assert isinstance(error, UserError) and not isinstance(error, WeightPathForbidden), error
    assert str(error) == f"weight file {path / name} is not a regular file"


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "extra.safetensors"])
def test_a_file_linking_outside_the_roots_is_forbidden(tmp_path, name):
    root = tmp_path / "weights"
    path = _weights(root / "step_1")
    secret = tmp_path / "elsewhere" / name
    secret.parent.mkdir()
    secret.write_text("x")
    (path / name).unlink(missing_ok=True)
    (path / name).symlink_to(secret)
    with pytest.raises(WeightPathForbidden, match=f"weight path {path / name} is outside the allowed"):
        check_weight_dir(path, None, (root,))
    (path / name).unlink()
    (path / name).symlink_to(tmp_path / "elsewhere" / "missing")  # refused before it is looked at
    with pytest.raises(WeightPathForbidden):
        check_weight_dir(path, None, (root,))


def test_a_file_linking_inside_the_roots_is_fine(tmp_path):
    root = tmp_path / "weights"
    path = _weights(root / "step_2")
    (path / "model.safetensors").unlink()
    (path / "model.safetensors").symlink_to(_weights(root / "step_1") / "model.safetensors")
    assert check_weight_dir(path, None, (root,)) == (path, 2)

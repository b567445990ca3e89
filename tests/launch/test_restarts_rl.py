"""`rl` survives its processes dying. The only inference server killed mid-run, then the restarted one stopped
(SIGSTOP) past `deployment.hang_timeout_s`: each time rl restarts it and the orchestrator loads the newest weights on
it before it samples again. The trainer killed, then the orchestrator: each time rl runs the whole run again from
its newest checkpoint. Either way the run finishes every step once with no process left behind."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.rl_runs import (
    alive,
    check_samples_once,
    cmdline,
    component_pids,
    descendants,
    logged_steps,
    rows_by_source,
    small_run_config,
    start_rl,
    trained_steps,
    wait_for_trained_step,
)

pytestmark = [pytest.mark.slow, pytest.mark.faults]  # the faults tier: CI runs it beside the learning tier


def wait_for(condition, proc, log, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def pid_of(proc, component: str) -> int:
    (pid,) = component_pids(proc, component)
    return pid


def test_the_only_server_killed_then_hung_is_restarted_and_the_run_finishes(tmp_path, tiny_model_dir):
    # 60 steps of ~0.1 s: rl's probe (every 2 s) sees the restarted server answer while steps remain to stall.
    run_dir, log, steps = tmp_path / "run", tmp_path / "rl.log", 60
    proc = start_rl(small_run_config(tmp_path, tiny_model_dir, steps, "--deployment.hang-timeout-s", "10",
                                     "--max-async-level", "1"), log)
    try:
        wait_for_trained_step(proc, run_dir, 2, log)
        first = pid_of(proc, "inference")
        os.kill(first, signal.SIGKILL)
        wait_for_trained_step(proc, run_dir, 5, log)
        wait_for(lambda: "rl: inference answers again" in log.read_text(), proc, log)  # rl saw it up again: a
        second = pid_of(proc, "inference")  # hang from now on is one (before, it would still be starting)
        assert second != first and max(trained_steps(run_dir)) < steps - 1, "the run outran the restart"
        tree = descendants(proc.pid)
        os.kill(second, signal.SIGSTOP)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "inference exited with code -9; restarting it in 1s (restart 1 of 3" in output, output[-3000:]
    assert "inference did not answer" in output and "restart 2 of 3" in output, output[-3000:]
    for source in ("trainer", "orchestrator"):
        assert logged_steps(run_dir, source) == list(range(steps)), source
    # No rollout was sampled by the initial weights a restarted server came back with: the async bound held.
    assert all(row["async/policy_lag_max"] <= 1 for row in rows_by_source(run_dir, "orchestrator").values())
    assert not alive(tree | {first, second}), [cmdline(p) for p in alive(tree)]


def test_a_killed_trainer_then_orchestrator_run_the_run_again_from_its_newest_checkpoint(tmp_path, tiny_model_dir):
    run_dir, log, steps = tmp_path / "run", tmp_path / "rl.log", 10
    proc = start_rl(small_run_config(tmp_path, tiny_model_dir, steps, "--ckpt.interval", "2"), log)
    seen: set[int] = set()
    try:
        for component, after in (("trainer", 3), ("orchestrator", 6)):
            wait_for_trained_step(proc, run_dir, after, log)
            seen |= descendants(proc.pid)
            victim = pid_of(proc, component)
            os.kill(victim, signal.SIGKILL)
            said = f"{component} exited with code -9; running the run again"
            wait_for(lambda said=said: said in log.read_text(), proc, log)
        seen |= descendants(proc.pid)
        proc.wait(timeout=300)
    finally:
        proc.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    for component, restart in (("trainer", 1), ("orchestrator", 1)):
        assert f"rl: warning: {component} exited with code -9; running the run again from checkpoint step" in output
        assert f"(restart {restart} of 3 within 3600s" in output, output[-3000:]
    for source in ("trainer", "orchestrator"):
        assert logged_steps(run_dir, source) == list(range(steps)), source
    check_samples_once(run_dir, steps)
    assert not alive(seen), [cmdline(p) for p in alive(seen)]

"""`rl` with `inference.num_servers = 2`: requests spread over both servers, both load every weight step
(the run stays exactly on-policy), one server killed mid-run is restarted and the run finishes, and both killed
without restarts end the run within 15 s with no process left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.rl_in_process import on_policy_run
from tests.support.rl_runs import rows_by_source

pytestmark = [pytest.mark.slow]

TWO = "[inference]\nnum_servers = 2\n"


def test_two_servers_share_the_requests_and_stay_on_policy(tmp_path):
    run = on_policy_run(tmp_path, TWO, seq_len=256, max_tokens=8)  # mismatch KL < 1e-6 at every step
    for step, row in run.rows("orchestrator").items():
        assert row["rollout/servers_live"] == 2 and row["rollout/server_share_max"] == 0.5, (step, row)
    assert run.served_steps == {"inference": 2, "inference_1": 2}  # both loaded every update step 2 needed


def pids_of(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) != os.getpid()]


def start_run(tmp_path, steps: int, *extra: str) -> tuple[subprocess.Popen, object]:
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "prime_rl.launch.rl", "--model.name", "tiny-reverse-text", "--output-dir", str(run),
         "--max-steps", str(steps), "--seq-len", "256", "--orchestrator.batch-size", "16",
         "--orchestrator.rollouts-per-example", "4", "--orchestrator.sampling.max-tokens", "8",
         "--wandb.mode", "disabled", "--inference.num-servers", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return process, run


def wait_for_step(run, step: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()[-3000:]
        if (run / "metrics.jsonl").exists() and max(rows_by_source(run, "trainer"), default=-1) >= step:
            return
        time.sleep(0.3)
    raise AssertionError(f"step {step} not reached")


def test_one_server_killed_mid_run_is_restarted_and_the_run_finishes(tmp_path):
    process, run = start_run(tmp_path, steps=12)
    try:
        wait_for_step(run, 2, process)
        (victim,) = pids_of(f"{run}/configs/inference_1.toml")
        os.kill(victim, signal.SIGKILL)
        out, _ = process.communicate(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 0, out[-3000:]
    assert "warning: inference_1 exited with code -9; restarting it" in out, out[-3000:]
    assert sorted(rows_by_source(run, "orchestrator")) == list(range(12))
    log = (run / "logs" / "orchestrator.log").read_text()  # its requests went to the other server meanwhile, or
    assert "dropped" in log or "it restarted" in log, log[-3000:]  # waited for the restart (then reloaded it)


def test_both_servers_killed_without_restarts_end_the_run_fast_and_leave_no_process(tmp_path):
    process, run = start_run(tmp_path, 200, "--deployment.max-restarts", "0")
    try:
        wait_for_step(run, 1, process)
        servers = pids_of(f"{run}/configs/inference")
        assert len(servers) == 2
        for pid in servers:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = process.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        process.kill()
    assert process.returncode not in (0, None) and took < 15, (took, out[-3000:])
    time.sleep(1)
    assert pids_of(str(run)) == [], "orphans left"

"""`rl` end to end on a tiny random model: failure of any component, Ctrl-C, resume.

Each test runs the real launcher as a subprocess (inference server, orchestrator and
trainer as its children) and checks the process tree afterwards: no child may survive.
What a resume computes is checked in-process after a kill (`tests/support/rl_in_process.py`), and once
through the launcher after Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.inference_server import VLLM_CPU_ARGS, VLLM_SKIP_REASON
from tests.support.rl_in_process import run_in_process
from tests.support.rl_runs import (
    MODULES,
    alive,
    cmdline,
    complete_checkpoints,
    descendants,
    logged_steps,
    resume_and_check,
    small_run_config,
    start_rl,
    wait_for_trained_step,
)

pytestmark = [pytest.mark.slow]


def test_ctrl_c_stops_cleanly_and_resume_continues_the_step_numbers(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    log = tmp_path / "rl.log"
    # Far more steps than run before the interrupt (a short run could finish first on a quiet machine).
    proc = start_rl(small_run_config(tmp_path, tiny_model_dir, 1000, "--ckpt.interval", "1"), log)
    wait_for_trained_step(proc, run_dir, 2, log)
    tree = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert "resume-step latest" in log.read_text()
    assert not alive(tree), [cmdline(p) for p in alive(tree)]

    # The orchestrator may have checkpointed a step further (it runs ahead by max_async_level):
    # resume uses the newest step both components saved.
    saved = complete_checkpoints(run_dir)
    assert saved and saved[-1] >= 2
    steps = saved[-1] + 3  # the resumed run trains three more steps
    resume_and_check(small_run_config(tmp_path, tiny_model_dir, steps, "--ckpt.interval", "1"), run_dir,
                     tmp_path / "rl_resume.log", steps, saved[-1])


# (killed process, max_async_level, ckpt.keep, ckpt.interval, max_steps, trained step to kill after).
# Interval 4 > keep_weights 3: by the kill the resume step's weights were pruned.
KILL_CASES = [
    ("trainer", 0, 1, 1, 5, 2),
    ("orchestrator", 1, 2, 4, 9, 5),
    ("inference", 2, 3, 2, 7, 3),
]


@pytest.mark.parametrize(("component", "async_level", "keep", "interval", "max_steps", "kill_after"), KILL_CASES)
def test_a_killed_component_stops_the_run_and_resume_completes_every_step_once(
        component, async_level, keep, interval, max_steps, kill_after, tmp_path, tiny_model_dir):
    """kill -9 one process mid-run (no restarts): rl stops within 15 s, names it, exits non-zero and leaves no
    process behind; retention kept a complete checkpoint, and resuming 'latest' (in-process: the plan `rl` makes)
    neither waits for pruned weights nor logs a step twice."""
    run_dir = tmp_path / "run"
    log = tmp_path / "rl.log"
    args = small_run_config(tmp_path, tiny_model_dir, max_steps, "--max-async-level", str(async_level),
                            "--ckpt.keep", str(keep), "--ckpt.interval", str(interval),
                            "--trainer.keep-weights", "3", "--deployment.max-restarts", "0")  # a server that dies
    # is restarted by default (tests/launch/test_server_restarts_rl.py): here it stops the run as the others do
    proc = start_rl(args, log)
    wait_for_trained_step(proc, run_dir, kill_after, log)
    tree = descendants(proc.pid)
    victims = [pid for pid in tree if MODULES[component] in cmdline(pid)]
    assert victims, f"no {component} process among {[cmdline(p) for p in tree]}"
    os.kill(victims[0], signal.SIGKILL)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"rl still running 15s after the {component} was killed")
    assert proc.returncode not in (0, None)
    output = log.read_text()
    assert f"{component} exited" in output or f"{component} stopped" in output, output[-2000:]
    assert not alive(tree), [cmdline(p) for p in alive(tree)]

    saved = complete_checkpoints(run_dir)
    # One more than `keep` when the kill fell between a checkpoint's write and its pruning; the resume prunes it.
    assert 1 <= len(saved) <= keep + 1, saved
    resumed_from = saved[-1]
    # Whatever the timing of the kill, the resume step's weights are gone as retention would have it.
    for step_dir in (run_dir / "weights").glob("step_*"):
        if int(step_dir.name.split("_")[1]) <= resumed_from:
            shutil.rmtree(step_dir)
    resumed = run_in_process([*args, "--ckpt.resume-step", "latest"])
    assert resumed.plan.resumed == resumed_from
    for source in ("trainer", "orchestrator"):
        assert logged_steps(run_dir, source) == list(range(max_steps)), source
    assert not list(run_dir.glob("**/.*.tmp")), list(run_dir.glob("**/.*.tmp"))
    written = sorted({*range(interval, max_steps + 1, interval), max_steps})
    assert sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir()) == written[-keep:]


def metric_rows(run_dir: Path, source: str) -> dict[int, dict]:
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return {row["step"]: row for row in rows if row["source"] == source}


def run_on_vllm(tmp_path: Path, steps: int, *extra: str) -> tuple[Path, dict[int, dict], dict[int, dict]]:
    """A small `rl` run of `steps` steps with vLLM serving (vllm-cpu on a CPU host) and the embedded model (head_dim
    32: vLLM's CPU attention has no kernel for the suite's head_dim 16): its directory and the trainer's and the
    orchestrator's metrics by step."""
    pytest.importorskip("vllm", reason=VLLM_SKIP_REASON)
    run_dir, log = tmp_path / "run", tmp_path / "rl.log"
    vllm_args = [f"--inference.{arg[2:]}" if arg.startswith("--") else arg for arg in VLLM_CPU_ARGS]
    args = small_run_config(tmp_path, Path("tiny-reverse-text"), steps, "--inference.backend", "vllm", *vllm_args,
                            *extra)
    proc = start_rl(args, log)
    try:
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
    trainer = metric_rows(run_dir, "trainer")
    assert sorted(trainer) == list(range(steps))
    return run_dir, trainer, metric_rows(run_dir, "orchestrator")


@pytest.mark.vllm
@pytest.mark.parametrize("transfer", ["filesystem", "distributed"])
def test_rl_on_the_vllm_backend_is_on_policy_and_updates_weights(tmp_path, transfer):
    """Three steps with vLLM serving: the whole tree, weight sync included, through the filesystem or over the
    torch.distributed group that vLLM's workers join (gloo)."""
    # Over the group at max_async_level 0: every step's rollouts come from the weights the trainer just sent.
    lag = ["--max-async-level", "0"] if transfer == "distributed" else []
    run_dir, trainer, orchestrator = run_on_vllm(tmp_path, 3, "--weight-transfer.mode", transfer, *lag)
    # Step 0 is sampled by the very weights the trainer starts from: vLLM's processed logprobs
    # must equal the trainer's (k3 estimate of the KL, as in the builtin server's test).
    assert abs(trainer[0]["loss/mismatch_kl"]) < 1e-6
    if transfer == "filesystem":  # later rollouts were stamped with the step the server was updated to: at step 2
        # a lag <= 1 means it serves step >= 1 (lag 0 when the trainer's step 2 was already there: timing)
        assert all(orchestrator[step]["async/policy_lag_max"] <= 1.0 for step in (1, 2)), orchestrator
        return
    # Only markers on disk, yet every step is exactly on-policy: vLLM serves the weights that came over the group.
    assert sorted(p.name for p in (run_dir / "weights" / "step_2").iterdir()) == ["transfer.json"]
    assert all(abs(trainer[step]["loss/mismatch_kl"]) < 1e-6 for step in (1, 2)), trainer
    assert [orchestrator[step]["async/policy_lag_max"] for step in (1, 2)] == [0.0, 0.0]
    log_text = (run_dir / "logs" / "inference.log").read_text()
    assert "vLLM workers joining the trainer's weight transfer group as ranks [1]" in log_text
    assert "joined the trainer's weight transfer group" in log_text


@pytest.mark.vllm
@pytest.mark.parametrize("lag, kv", [(0, "keep"), (1, "recompute")])
def test_rl_on_vllm_in_continuous_mode_swaps_weights_in_flight(tmp_path, lag, kv):
    """Continuous rollouts on vLLM (vllm-cpu on a CPU host): weights load in flight (vLLM paused with mode "keep",
    the running requests' KV cache kept or recomputed), every token carries the step vLLM labelled it with, and the
    lag bound holds per token; at max_async_level 0 no update lands while a batch samples, so every step is exactly
    on-policy."""
    run_dir, trainer, orchestrator = run_on_vllm(tmp_path, 4, "--orchestrator.rollout-mode", "continuous",
                                                 "--max-async-level", str(lag), "--inference.vllm.in-flight-kv", kv)
    assert "in flight update took" in (run_dir / "logs" / "inference.log").read_text()
    assert all(orchestrator[step]["async/token_lag_max"] <= lag for step in range(4)), orchestrator
    if lag == 0:
        assert all(abs(trainer[step]["loss/mismatch_kl"]) < 1e-6 for step in range(4)), trainer


def test_a_server_that_dies_at_start_stops_the_run_and_the_orchestrator_waiting_at_its_gate(tmp_path, tiny_model_dir):
    """rl starts the orchestrator with the server (it imports, then waits for rl to open its gate): when the
    server dies before answering /health, rl reports the server, and the gated orchestrator, which never
    connected, is stopped with everything else."""
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    log = tmp_path / "rl.log"
    proc = start_rl(small_run_config(tmp_path, broken, 3), log)
    seen: dict[int, str] = {}  # every process of rl's tree while rl lives, with its last command line read
    while proc.poll() is None:
        for pid in descendants(proc.pid):  # read again at every poll: a child caught between fork and exec still
            seen[pid] = cmdline(pid) or seen.get(pid, "")  # shows rl's command line (missed once under load in CI)
        time.sleep(0.05)
    tree = set(seen)
    assert proc.returncode not in (0, None)
    assert any(MODULES["orchestrator"] in line for line in seen.values()), seen  # it was started with the server
    text = log.read_text()
    assert "inference" in text and "exited" in text, text[-2000:]
    assert not alive(tree), [cmdline(p) for p in alive(tree)]
    orchestrator_log = tmp_path / "run" / "logs" / "orchestrator.log"
    assert not orchestrator_log.exists() or "serve" not in orchestrator_log.read_text()

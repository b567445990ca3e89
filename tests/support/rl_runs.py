"""Run `rl` as a subprocess on a tiny model and inspect what it left: the helpers of the launcher's tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from prime_rl.run_dir import rollout_dir, rollouts_root, samples_file, token_outcomes_file
from prime_rl.utils.fs import list_steps
from tests.support import REPO, TASKSETS

STEP_TIMEOUT_S = 240


def small_run_config(tmp_path: Path, model_dir: Path, max_steps: int, *extra: str) -> list[str]:
    """A tiny, fast run: 8 samples of at most 8 tokens per step."""
    return [
        "--model.name", str(model_dir), "--output-dir", str(tmp_path / "run"), "--max-steps", str(max_steps),
        "--seq-len", "256", "--orchestrator.batch-size", "8", "--orchestrator.rollouts-per-example", "4",
        "--orchestrator.sampling.max-tokens", "8", "--wandb.mode", "disabled", *extra,
    ]


def _as_in_a_terminal() -> None:
    """SIGINT as a terminal's foreground process has it: a suite started in the background (`cmd &`, as CI may)
    hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_rl(args: list[str], log: Path, prefix: Sequence[str] = ()) -> subprocess.Popen:
    """`rl` with `args`, output to `log`; `prefix` runs it through a wrapper (e.g. nsenter)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    with open(log, "wb") as out:
        return subprocess.Popen([*prefix, sys.executable, "-m", "prime_rl.launch.rl", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=_as_in_a_terminal)


def descendants(pid: int) -> set[int]:
    """Every live process whose parent chain reaches `pid` (read from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pids: set[int]) -> set[int]:
    live = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(pid)
    return live


def trained_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["source"] == "trainer" and "loss/importance_ratio" in record:
            steps.append(record["step"])
    return steps


def wait_for_trained_step(proc: subprocess.Popen, run_dir: Path, step: int, log: Path) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        if step in trained_steps(run_dir):
            return
        if proc.poll() is not None:
            pytest.fail(f"rl exited early with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"step {step} not trained within {STEP_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")


MODULES = {
    "trainer": "prime_rl.trainer.rl.train",
    "inference": "prime_rl.inference.server",
    "orchestrator": "prime_rl.orchestrator.orchestrator",
}


def component_pids(proc: subprocess.Popen, component: str, timeout_s: float = 120) -> list[int]:
    """The processes of `component` under `rl`, once there are some (none while rl runs the run again); fails when
    rl exits first or none appears within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [pid for pid in descendants(proc.pid) if MODULES[component] in cmdline(pid)]
        if found:
            return found
        assert proc.poll() is None and time.monotonic() < deadline, f"no {component} process under rl"
        time.sleep(0.1)


def logged_steps(run_dir: Path, source: str) -> list[int]:
    """Steps of `source`'s metrics.jsonl lines, in file order, duplicates kept."""
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [row["step"] for row in rows if row["source"] == source]


def complete_checkpoints(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").iterdir()
                  if (p / "trainer").is_dir() and (p / "orchestrator").is_dir())


def resume_and_check(args: list[str], run_dir: Path, log: Path, max_steps: int, resumed_from: int,
                     prefix: Sequence[str] = ()) -> None:
    """Resume with 'latest'; the run completes and every step is in metrics.jsonl exactly once."""
    proc = start_rl([*args, "--ckpt.resume-step", "latest"], log, prefix)
    try:
        assert proc.wait(timeout=STEP_TIMEOUT_S * 2) == 0, log.read_text()[-3000:]
    finally:
        proc.kill()
    assert f"resuming after step {resumed_from}" in log.read_text()
    for source in ("trainer", "orchestrator"):
        assert logged_steps(run_dir, source) == list(range(max_steps)), source
    assert not list(run_dir.glob("**/.*.tmp")), list(run_dir.glob("**/.*.tmp"))
    assert (run_dir / "metrics.png").exists()
    check_samples_once(run_dir, max_steps)


def check_samples_once(run_dir: Path, max_steps: int) -> None:
    """Every step's samples on disk once, however the run was stopped and resumed: one samples.jsonl per step,
    holding that step's rollouts alone, and the trainer's record of each of its samples once."""
    assert list_steps(rollouts_root(run_dir)) == list(range(max_steps))
    for step in range(max_steps):
        directory = rollout_dir(run_dir, step)
        lines = [json.loads(line) for line in samples_file(directory).read_text().splitlines()]
        assert lines and {line["step"] for line in lines} == {step}, step
        keys = [t["key"] for line in lines if line["kept"] for t in line["tokens"]]
        recorded = [json.loads(line)["key"] for line in token_outcomes_file(directory, 0).read_text().splitlines()]
        assert sorted(recorded) == sorted(keys), step


def rows_by_source(run_dir: Path, source: str) -> dict[int, dict]:
    """The last metrics.jsonl line of each step logged by `source`."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["source"] == source:
            rows[row["step"]] = row
    return rows


def on_policy_args(tmp_path: Path, env_table: str, seq_len: int, max_tokens: int, model: str = "tiny-reverse-text",
                   max_steps: int = 3, resume: bool = False) -> list[str]:
    """The `rl` arguments of an on-policy test run: `max_steps` steps on the embedded `model` with `env_table` (TOML:
    an `[[orchestrator.env]]` table, other sections; written to `tmp_path/rl.toml`), at max_async_level 0 (fp32,
    builtin), 16 samples (groups of 4) per step, output in `tmp_path/run`; `resume`: continue that run from its
    latest checkpoint as a user would, running its recorded `configs/rl.toml` with `--ckpt.resume-step latest`
    and the new `--max-steps`."""
    run_dir, config = tmp_path / "run", tmp_path / "rl.toml"
    if resume:
        return ["@", str(run_dir / "configs" / "rl.toml"), "--max-steps", str(max_steps), "--ckpt.resume-step",
                "latest"]
    config.write_text(env_table)
    return ["@", str(config), "--model.name", model, "--output-dir", str(run_dir), "--max-steps", str(max_steps),
            "--max-async-level", "0", "--seq-len", str(seq_len), "--orchestrator.batch-size", "16",
            "--orchestrator.rollouts-per-example", "4", "--orchestrator.sampling.max-tokens", str(max_tokens),
            "--wandb.mode", "disabled"]


def check_on_policy(run_dir: Path, max_steps: int, exact: bool = True) -> tuple[dict[int, dict], dict[int, dict]]:
    """Both components logged every step, and (unless not `exact`) the trainer's logprobs equal the server's at
    every step (mismatch KL < 1e-6: true only if every trained token sits where it was sampled); returns the
    (trainer, orchestrator) rows."""
    trainer, orchestrator = rows_by_source(run_dir, "trainer"), rows_by_source(run_dir, "orchestrator")
    assert sorted(trainer) == sorted(orchestrator) == list(range(max_steps))
    for step, row in trainer.items():
        assert not exact or abs(row["loss/mismatch_kl"]) < 1e-6, (step, row["loss/mismatch_kl"])
    return trainer, orchestrator


def on_policy_rl_process(tmp_path: Path, env_table: str, seq_len: int, max_tokens: int,
                         extra: Sequence[str] = ()) -> tuple[dict[int, dict], dict[int, dict]]:
    """`on_policy_args` run by the real `rl` process (for what the in-process harness cannot run: several trainer
    ranks), checked by `check_on_policy`; returns the (trainer, orchestrator) rows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(TASKSETS), env.get("PYTHONPATH")]))
    args = on_policy_args(tmp_path, env_table, seq_len, max_tokens)
    result = subprocess.run([sys.executable, "-m", "prime_rl.launch.rl", *args, *extra],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return check_on_policy(tmp_path / "run", 3)

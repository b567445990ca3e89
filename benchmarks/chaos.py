"""A chaos run: `rl` on the tiny reverse-text model while this script kills (SIGKILL) and stops (SIGSTOP) its processes
at random steps, then checks that the run finished as an undisturbed one does.

    uv run python benchmarks/chaos.py                       # 5 runs of 30 steps, 4 events each, and one undisturbed
    uv run python benchmarks/chaos.py --runs 1 --events 6 --servers 2 --seed 3

Each event waits until a random step (after the previous event's recovery) was trained, then either kills the
inference server, the trainer or the orchestrator (kill -9) or stops an inference server (SIGSTOP: a hang, found by
`deployment.hang_timeout_s`), and waits until `rl` said it restarted it ("answers again", "running the run again").
No component is hit more than `deployment.max_restarts` times. A trainer or an orchestrator that hangs is not
an event: `rl` watches only the servers' /health (docs/deployment.md#when-a-process-dies).

Checked for each run: `rl` exited 0; every step logged once by the trainer and by the orchestrator; every step's
samples on disk once; no process of the run left; and the mean reward of the last 5 steps beside the undisturbed
run's with the same seed. Prints one JSON object per run, then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.rl_runs import (  # noqa: E402  (the test helpers read runs the same way)
    alive,
    check_samples_once,
    component_pids,
    descendants,
    logged_steps,
    rows_by_source,
    trained_steps,
)

HANG_TIMEOUT_S = 10
RECOVERY = {"kill": {"inference": "answers again", "trainer": "running the run again",
                     "orchestrator": "running the run again"},
            "stop": {"inference": "answers again"}}


def rl_args(run_dir: Path, steps: int, servers: int, seed: int) -> list[str]:
    return ["--model.name", "tiny-reverse-text", "--output-dir", str(run_dir), "--max-steps", str(steps),
            "--seq-len", "256", "--orchestrator.batch-size", "32", "--orchestrator.rollouts-per-example", "8",
            "--orchestrator.sampling.max-tokens", "16", "--wandb.mode", "disabled", "--ckpt.interval", "3",
            "--deployment.hang-timeout-s", str(HANG_TIMEOUT_S), "--inference.num-servers", str(servers),
            "--seed", str(seed)]


def wait(condition, proc: subprocess.Popen, timeout_s: float = 600) -> bool:
    """Until `condition()`; False when rl exited first or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def one_run(steps: int, events: int, servers: int, seed: int, rng: random.Random | None) -> dict:
    """One run (`rng` None: undisturbed); what happened and what was checked."""
    out = Path(tempfile.mkdtemp(prefix="chaos-"))
    run_dir, log = out / "run", out / "rl.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    start = time.monotonic()
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "prime_rl.launch.rl", *rl_args(run_dir, steps, servers, seed)],
                                stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    seen: set[int] = set()
    done: list[dict] = []
    hits = {"inference": 0, "trainer": 0, "orchestrator": 0}
    try:
        last = 1
        for _ in range(events if rng is not None else 0):
            room = steps - 3 - last
            if room < 1:
                break
            step = last + rng.randint(1, max(1, room // 2))
            if not wait(lambda s=step: s in trained_steps(run_dir), proc):
                break
            choices = [(a, c) for a, cs in RECOVERY.items() for c in cs if hits[c] < 3]
            action, component = rng.choice(choices)
            said = log.read_text().count(RECOVERY[action][component])
            try:
                pids = component_pids(proc, component)
            except AssertionError:  # rl ended (or none came): the checks below say how it ended
                break
            seen |= descendants(proc.pid)
            os.kill(rng.choice(pids), signal.SIGKILL if action == "kill" else signal.SIGSTOP)
            hits[component] += 1
            hit = time.monotonic()
            recovered = wait(lambda a=action, c=component, n=said: log.read_text().count(RECOVERY[a][c]) > n, proc)
            done.append({"step": step, "action": action, "component": component,
                         "recovered_s": round(time.monotonic() - hit, 1) if recovered else None})
            last = max(trained_steps(run_dir), default=step)
        seen |= descendants(proc.pid)
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(1)
    result = {"seed": seed, "events": done, "exit": proc.returncode, "wall_s": round(time.monotonic() - start, 1),
              "orphans": len(alive(seen))}
    try:
        result["steps_once"] = all(logged_steps(run_dir, s) == list(range(steps)) for s in ("trainer", "orchestrator"))
        check_samples_once(run_dir, steps)
        result["samples_once"] = True
    except AssertionError:
        result["samples_once"] = False
    rewards = [row["reward/mean"] for _, row in sorted(rows_by_source(run_dir, "orchestrator").items())]
    result["final_reward"] = round(sum(rewards[-5:]) / max(len(rewards[-5:]), 1), 4)
    result["log"] = str(log)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--events", type=int, default=4)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    calm = one_run(args.steps, 0, args.servers, args.seed, None)
    print(json.dumps({"undisturbed": calm}), flush=True)
    results = []
    for run in range(args.runs):
        result = one_run(args.steps, args.events, args.servers, args.seed, random.Random(args.seed * 1000 + run))
        results.append(result)
        print(json.dumps(result), flush=True)
    passed = [r for r in results if r["exit"] == 0 and r["steps_once"] and r["samples_once"] and not r["orphans"]]
    print(json.dumps({"passed": f"{len(passed)} of {len(results)}",
                      "events": sum(len(r["events"]) for r in results),
                      "final_reward": [r["final_reward"] for r in results],
                      "undisturbed_final_reward": calm["final_reward"], "undisturbed_wall_s": calm["wall_s"],
                      "wall_s": [r["wall_s"] for r in results]}))


if __name__ == "__main__":
    main()

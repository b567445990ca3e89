"""Wall time to a reward gain: runs `rl` on an example config and reads its metrics.jsonl.

    uv run python benchmarks/time_to_reward.py                                  # examples/reverse_text/rl.toml
    uv run python benchmarks/time_to_reward.py --config examples/reverse_text/rl.toml --runs 2
    uv run python benchmarks/time_to_reward.py -- --max-steps 40               # after --: passed to rl

Reward curve: the orchestrator's `reward/mean` per step. The gain at step s is the mean of
steps s-4..s (a 5-step running mean; fewer at the start) minus step 0's reward, and the
time to a gain g is the wall time from starting `rl` until the orchestrator logged the
first step whose gain reaches g (`time` of that metrics line). Also reported: the whole
run's wall time, when step 0 was logged (start-up + one step), the final reward (mean of
the last 5 steps), and medians per step of the metrics in `PER_STEP` (absent ones are
null: an older checkout does not log them). Run it on a quiet machine: 2 cores are easily disturbed
(the load average before each run is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GAINS = (0.10, 0.15, 0.25)
WINDOW = 5
PER_STEP = {
    "trainer": ("perf/step_time_s", "async/wait_for_batch_s", "perf/tokens_per_s", "perf/trainer_idle_frac"),
    "orchestrator": ("perf/step_time_s", "perf/wait_for_weights_s", "perf/inference_tokens_per_s",
                     "async/inference_idle_frac", "async/token_lag_mean", "async/token_lag_max"),
}


def read_metrics(path: Path) -> list[dict]:
    """The metrics lines of `path` (none if it does not exist yet; a line still being written is skipped)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def time_to_gains(rows: list[dict], start: float, gains=GAINS, metric: str = "reward/mean",
                  baseline: float | None = None, source: str = "orchestrator") -> dict[str, float | None]:
    """Seconds from `start` to the first step (of `source`'s lines) whose WINDOW-step running mean of `metric`
    reaches baseline + gain, for each of `gains` (None: never); the baseline is the first step's value unless given."""
    steps = sorted((r for r in rows if r.get("source") == source and metric in r), key=lambda r: r["step"])
    if not steps:
        return {f"+{g:.2f}": None for g in gains}
    values = [r[metric] for r in steps]
    first = values[0] if baseline is None else baseline
    reached: dict[str, float | None] = {}
    for gain in gains:
        reached[f"+{gain:.2f}"] = None
        for i, row in enumerate(steps):
            window = values[max(0, i - WINDOW + 1):i + 1]
            if statistics.fmean(window) - first >= gain:
                reached[f"+{gain:.2f}"] = round(row["time"] - start, 1)
                break
    return reached


def summarize(rows: list[dict], start: float, end: float, source: str = "orchestrator") -> dict:
    """The run's wall time, first step, rewards and times to GAINS from `source`'s reward/mean lines; medians of
    PER_STEP's metrics."""
    steps = sorted((r for r in rows if r["source"] == source and "reward/mean" in r), key=lambda r: r["step"])
    rewards = [r["reward/mean"] for r in steps]
    result = {
        "wall_s": round(end - start, 1),
        "first_step_s": round(steps[0]["time"] - start, 1) if steps else None,  # start-up + step 0
        "steps": len(rewards),
        "first_reward": round(rewards[0], 4) if rewards else None,
        "final_reward_last5": round(statistics.fmean(rewards[-WINDOW:]), 4) if rewards else None,
        "time_to_gain_s": time_to_gains(rows, start, source=source),
    }
    for source, keys in PER_STEP.items():
        for key in keys:
            values = [r[key] for r in rows if r["source"] == source and key in r]
            result[f"{source} {key} (median)"] = round(statistics.median(values), 3) if values else None
    return result


def run_once(config: Path, rl_args: list[str], output_dir: Path) -> dict:
    command = [sys.executable, "-m", "prime_rl.launch.rl", "@", str(config), "--output-dir", str(output_dir),
               "--wandb.mode", "disabled", *rl_args]
    start = time.time()
    completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.time()
    if completed.returncode != 0:
        raise SystemExit(f"rl failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
    return summarize(read_metrics(output_dir / "metrics.jsonl"), start, end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "reverse_text" / "rl.toml")
    parser.add_argument("--runs", type=int, default=1, help="repetitions, back to back")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("rl_args", nargs="*", help="extra rl arguments (after --)")
    args = parser.parse_args()
    results = []
    for i in range(args.runs):
        load = os.getloadavg()
        print(f"run {i + 1}/{args.runs}: load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
        with tempfile.TemporaryDirectory(prefix="time_to_reward_") as tmp:
            result = {"load_before": [round(x, 2) for x in load],
                      **run_once(args.config, args.rl_args, Path(tmp) / "run")}
        print(json.dumps(result, indent=2), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

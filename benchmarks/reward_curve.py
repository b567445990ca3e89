"""Reward against wall time of finished runs, side by side: the tables of examples/reverse_text/README.md's
on-policy distillation section.

    uv run python benchmarks/reward_curve.py outputs/reverse_text_opd outputs/reverse_text [--every 20]

For each run directory (its metrics.jsonl) and each mark of `--every` seconds (and the run's end): the last
step the orchestrator logged by then (seconds since the run's first metrics line), the mean training reward of
the `WINDOW` steps ending there, and `loss/teacher_kl` of that step's trainer line when the run logs it. Then
per run: seconds per step (orchestrator, first to last line) and the medians of a few per-step timings.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from time_to_reward import WINDOW, read_metrics  # benchmarks/ is the script's own directory

TIMINGS = ("perf/step_time_s", "perf/teacher_s", "perf/trainer_idle_frac", "perf/wait_for_weights_s")


def curve(rows: list[dict], marks: list[float]) -> list[tuple[float, int, float, float | None]]:
    """(elapsed, step, WINDOW-step mean reward, teacher KL or None) at each mark reached, and at the run's end."""
    start = min(r["time"] for r in rows)
    steps = sorted((r for r in rows if r["source"] == "orchestrator" and "reward/mean" in r), key=lambda r: r["step"])
    kl = {r["step"]: r["loss/teacher_kl"] for r in rows if r["source"] == "trainer" and "loss/teacher_kl" in r}
    rewards = [r["reward/mean"] for r in steps]
    end = steps[-1]["time"] - start
    points = []
    for mark in [m for m in marks if m < end] + [end]:
        i = max(i for i, r in enumerate(steps) if r["time"] - start <= mark + 1e-9)
        mean = statistics.fmean(rewards[max(0, i - WINDOW + 1):i + 1])
        points.append((mark, steps[i]["step"], mean, kl.get(steps[i]["step"])))
    return points


def timings(rows: list[dict]) -> str:
    steps = sorted((r for r in rows if r["source"] == "orchestrator"), key=lambda r: r["step"])
    parts = [f"{(steps[-1]['time'] - steps[0]['time']) / max(len(steps) - 1, 1):.2f} s/step"]
    for source in ("orchestrator", "trainer"):
        for key in TIMINGS:
            values = [r[key] for r in rows if r["source"] == source and key in r]
            if values:
                parts.append(f"{source} {key} {statistics.median(values):.3f}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (each with a metrics.jsonl)")
    parser.add_argument("--every", type=float, default=20.0, help="seconds between marks")
    args = parser.parse_args()
    for run in args.runs:
        rows = read_metrics(run / "metrics.jsonl")
        last = max(r["time"] for r in rows) - min(r["time"] for r in rows)
        marks = [args.every * k for k in range(int(last // args.every) + 1)]
        print(f"{run}: {timings(rows)}")
        for elapsed, step, reward, kl in curve(rows, marks):
            teacher = f", teacher KL {kl:.2f}" if kl is not None else ""
            print(f"  {elapsed:6.1f} s  step {step:3d}  reward {reward:.3f}{teacher}")


if __name__ == "__main__":
    main()

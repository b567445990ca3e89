"""The reverse-text example against TRL 1.16's GRPO trainer: wall time to a reward gain, back to back.

    uv run python benchmarks/versus_trl.py --trl-python /tmp/trlenv/bin/python --runs 2

Each run starts `rl @ examples/reverse_text/rl.toml` (as `benchmarks/time_to_reward.py` does), then TRL on the same
model, task, batch and cores (`benchmarks/trl_reverse_text.py`, in the Python given: how to make one is in that
file's docstring), one after the other, alternating. For both, the time to a gain is from launching the command
(imports and start-up included) to the step whose 5-step running mean of the batch's reward reaches step 0's reward
plus the gain (`time_to_reward.time_to_gains`). Prints each run and, per gain, ours / TRL's time of each pair and the
median ratio; `--json` writes them.
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
from collections.abc import Callable
from pathlib import Path

from time_to_reward import GAINS, ROOT, read_metrics, run_once, summarize  # benchmarks/ is the script's own directory

KEYS = ("wall_s", "first_step_s", "steps", "first_reward", "final_reward_last5", "time_to_gain_s")


def run_trl(python: str, max_steps: int, output_dir: Path) -> dict:
    """TRL's run of `max_steps` steps, summarized from the launch of its process."""
    command = [python, str(ROOT / "benchmarks" / "trl_reverse_text.py"), "--output-dir", str(output_dir),
               "--max-steps", str(max_steps)]
    start = time.time()
    completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    end = time.time()
    if completed.returncode != 0:
        raise SystemExit(f"TRL failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
    return summarize(read_metrics(output_dir / "metrics.jsonl"), start, end, source="trl")


def ratios(results: list[dict], gains=GAINS) -> dict[str, dict]:
    """Per gain: ours / TRL's time to it in each pair of runs, and their median (None where either never got there)."""
    table = {}
    for gain in gains:
        key = f"+{gain:.2f}"
        pairs = [(r["ours"]["time_to_gain_s"][key], r["trl"]["time_to_gain_s"][key]) for r in results]
        each = [round(ours / trl, 3) if ours is not None and trl else None for ours, trl in pairs]
        known = [x for x in each if x is not None]
        table[key] = {"each": each, "median": round(statistics.median(known), 3) if known else None}
    return table


def back_to_back(runs: int, prefix: str, run_one: Callable[[str, Path], dict]) -> list[dict]:
    """`runs` pairs, ours then TRL's (`run_one(name, run_dir)`, in a fresh temporary directory), each result with
    the load average before it; each printed as it ends."""
    results = []
    for i in range(runs):
        result = {}
        for name in ("ours", "trl"):
            load = os.getloadavg()
            print(f"run {i + 1}/{runs}, {name}: load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
                  flush=True)
            with tempfile.TemporaryDirectory(prefix=f"{prefix}_{name}_") as tmp:
                result[name] = {"load_before": [round(x, 2) for x in load], **run_one(name, Path(tmp) / "run")}
            print(json.dumps(result[name]), flush=True)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="a Python with trl 1.16 and prime-rl installed")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "reverse_text" / "rl.toml")
    parser.add_argument("--runs", type=int, default=2, help="pairs of runs, back to back")
    parser.add_argument("--max-steps", type=int, default=80, help="steps of each run (the example's 80)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()

    def run_one(name: str, run_dir: Path) -> dict:
        summary = (run_once(args.config, ["--max-steps", str(args.max_steps)], run_dir) if name == "ours"
                   else run_trl(args.trl_python, args.max_steps, run_dir))
        return {k: summary[k] for k in KEYS}

    results = back_to_back(args.runs, "versus_trl", run_one)
    report = {"runs": results, "ours_over_trl": ratios(results)}
    print(json.dumps(report["ours_over_trl"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""The SmolLM2 example against TRL 1.16's GRPO trainer: wall time to a held-out accuracy gain, back to back.

    uv run python benchmarks/versus_trl_smollm2.py --trl-python /tmp/trlenv/bin/python --runs 1

Each pair runs `rl @ examples/smollm2/rl.toml` with a held-out evaluation every --eval-interval steps, then TRL on
the same model, task, prompts, held-out set, batch, group size, completion length and cores
(`benchmarks/trl_smollm2.py`: how to make its Python is in its docstring). For both, the time to a gain is from
launching the command (imports, start-up and the model's load included) to the first held-out evaluation whose
greedy accuracy reaches the first evaluation's plus the gain, minus the time spent evaluating before it (ours logs
`perf/eval_s`; TRL's script stops its clock while it evaluates). Prints each run and, per gain, ours / TRL's time and
its median over the pairs; `--json` writes them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from time_to_reward import ROOT, read_metrics  # benchmarks/ is the script's own directory
from versus_trl import back_to_back, ratios

CONFIG = ROOT / "examples" / "smollm2" / "rl.toml"
GAINS = (0.10, 0.20, 0.30)
METRIC = "eval/chain-sum/pass@k"


def eval_points(rows: list[dict], source: str, start: float) -> list[tuple[int, float, float]]:
    """(step, held-out accuracy, seconds from `start` less the evaluation time so far) of each evaluation."""
    points, evaluating = [], 0.0
    for row in sorted((r for r in rows if r.get("source") == source and METRIC in r), key=lambda r: r["step"]):
        evaluating += row.get("perf/eval_s", 0.0)  # ours; TRL's times are already net of its evaluations
        points.append((row["step"], row[METRIC], round(row["time"] - start - evaluating, 1)))
    return points


def time_to_gains(points: list[tuple[int, float, float]]) -> dict[str, float | None]:
    first = points[0][1] if points else 0.0
    return {f"+{g:.2f}": next((t for _, accuracy, t in points if accuracy - first >= g - 1e-9), None) for g in GAINS}


def run(command: list[str], output_dir: Path, source: str) -> dict:
    start = time.time()
    completed = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if completed.returncode != 0:
        raise SystemExit(f"{source} failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
    points = eval_points(read_metrics(output_dir / "metrics.jsonl"), source, start)
    return {"wall_s": round(time.time() - start, 1), "evals": points, "time_to_gain_s": time_to_gains(points)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="a Python with trl 1.16, reasoning-gym and prime-rl")
    parser.add_argument("--runs", type=int, default=1, help="pairs of runs, back to back")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--eval-interval", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()

    def run_one(name: str, out: Path) -> dict:
        if name == "ours":
            return run([sys.executable, "-m", "prime_rl.launch.rl", "@", str(CONFIG), "--output-dir", str(out),
                        "--wandb.mode", "disabled", "--max-steps", str(args.max_steps + 1),
                        "--orchestrator.eval.interval", str(args.eval_interval)], out, "orchestrator")
        return run([args.trl_python, str(ROOT / "benchmarks" / "trl_smollm2.py"), "--output-dir", str(out),
                    "--max-steps", str(args.max_steps), "--eval-interval", str(args.eval_interval)], out, "trl")

    results = back_to_back(args.runs, "versus_trl_smollm2", run_one)
    report = {"runs": results, "ours_over_trl": ratios(results, GAINS)}
    print(json.dumps(report["ours_over_trl"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Step vs continuous rollouts when episode length is heavy-tailed: `rl` twice, back to back, on `HeavyTailReverse`.

    uv run python benchmarks/continuous_heavy_tail.py                          # 18 steps a mode, the defaults
    uv run python benchmarks/continuous_heavy_tail.py --steps 6 --out /tmp/heavy_tail.json
    PYTHONPATH=/tmp/site:$PWD/src:$PWD python3 benchmarks/continuous_heavy_tail.py   # a machine without uv

Each mode is one `rl` run (`sys.executable -m prime_rl.launch.rl`, the builtin backend, the embedded
tiny-reverse-text model, examples/reverse_text/rl.toml's trainer and sampling) on the environment of
`benchmarks/heavy_tail_env.py` (reverse-text episodes of K strings, K Pareto-distributed, a fixed latency before
each environment reply), with the same seed, batch, steps and everything else; only `orchestrator.rollout_mode`
differs. Per mode it prints one JSON line, then a markdown table of both:

- `wall_s`: the whole `rl` run (start-up included); `first_step_s`: to the orchestrator's step-0 metrics line;
  `steps_s`: from that line to the last step's.
- `time_to_gain_s`: seconds from the start of step 0 (its metrics line's time minus its `perf/step_time_s`: the
  start-up, which the first run pays more of on a cold machine, is left out) to the metrics line of the first step
  whose 5-step running mean of the first-turn reward (`reward/<env>/first`) reaches `baseline + gain`, the baseline
  being the mean of the runs' step-0 first-turn rewards (the same weights sampled them), so every mode is held to
  the same absolute threshold; `time_to_gain_from_launch_s`: the same from starting `rl`. The first turn measures
  the reverse-text skill alone: `reward/mean` also depends on how many long episodes the batch holds, which
  differs between the modes.
- `samples_per_s`: trained samples (`rollout/num_samples`) of steps 1..N-1 over `steps_s`.
- medians per step of `async/inference_idle_frac` (orchestrator: the share of the generation phase with no
  request in flight), `perf/trainer_idle_frac` and `async/wait_for_batch_s` (trainer), `perf/step_time_s` of both,
  and `rollout/turns_mean` (over the trained rollouts); `stale_groups`: continuous mode's groups dropped as too old
  for their batch (`async/stale_groups`, summed); `final_reward`, `final_first_turn`: the last 5 steps' means.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from time_to_reward import WINDOW, read_metrics, time_to_gains  # benchmarks/ is the script's own directory

ROOT = Path(__file__).resolve().parents[1]
ENV_FILE = Path(__file__).resolve().parent / "heavy_tail_env.py"
ENV_ID = "heavy-tail-reverse"  # HeavyTailReverse.id: the metrics are reward/heavy-tail-reverse/<component>
FIRST = f"reward/{ENV_ID}/first"
PROGRESS_S = 30.0  # at most one progress line per mode this often
MEDIANS = {
    "orchestrator": ("async/inference_idle_frac", "perf/step_time_s", "perf/wait_for_weights_s", "rollout/turns_mean",
                     "async/token_lag_mean"),
    "trainer": ("perf/trainer_idle_frac", "async/wait_for_batch_s", "perf/step_time_s"),
}
TABLE = (  # column, key in the result
    ("mode", "mode"), ("wall s", "wall_s"), ("first step s", "first_step_s"), ("steps", "steps"),
    ("samples/s", "samples_per_s"), ("inference idle", "orchestrator async/inference_idle_frac"),
    ("trainer idle", "trainer perf/trainer_idle_frac"), ("trainer wait s", "trainer async/wait_for_batch_s"),
    ("turns", "orchestrator rollout/turns_mean"), ("stale groups", "stale_groups"),
    ("final reward", "final_reward"), ("final first turn", "final_first_turn"),
)


def write_config(path: Path, args: argparse.Namespace, mode: str, output_dir: Path) -> None:
    env_args = {"turns_alpha": args.turns_alpha, "most_turns": args.most_turns,
                "reply_latency_s": args.reply_latency_s}
    path.write_text("\n".join([
        f"include = {json.dumps(str(ROOT / 'examples' / 'reverse_text' / 'rl.toml'))}",
        f"output_dir = {json.dumps(str(output_dir))}",
        f"max_steps = {args.steps}",
        f"max_async_level = {args.max_async_level}",
        f"seed = {args.seed}",
        "",
        "[orchestrator]",
        f"batch_size = {args.batch_size}",
        f"rollouts_per_example = {args.rollouts_per_example}",
        f'rollout_mode = "{mode}"',
        "",
        "[orchestrator.client]",
        f"max_concurrency = {args.max_concurrency or 2 * args.batch_size // args.rollouts_per_example}",
        "",
        "[[orchestrator.env]]",
        f"id = {json.dumps(f'{ENV_FILE}:HeavyTailReverse')}",
        "args = {" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env_args.items()) + "}",
        "",
    ]))


def stop(process: subprocess.Popen) -> None:
    """Stop `rl` as Ctrl-C does (it stops its components), then for good if it has not ended within 30 s."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def orchestrator_steps(rows: list[dict]) -> list[dict]:
    return sorted((r for r in rows if r.get("source") == "orchestrator" and "reward/mean" in r),
                  key=lambda r: r["step"])


def run_mode(args: argparse.Namespace, mode: str, work: Path) -> tuple[dict, list[dict], float]:
    """One `rl` run: (its summary without the time to reward, its metrics rows, its start time)."""
    run_dir = work / mode
    config = work / f"{mode}.toml"
    write_config(config, args, mode, run_dir)
    command = [sys.executable, "-m", "prime_rl.launch.rl", "@", str(config), "--wandb.mode", "disabled",
               "--overwrite", *args.rl_args]
    load = os.getloadavg()
    print(f"{mode}: starting rl ({args.steps} steps; load average {load[0]:.2f}); log {work / f'{mode}.log'}",
          flush=True)
    start = time.time()
    with open(work / f"{mode}.log", "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        last_note = start
        try:
            while process.poll() is None:
                time.sleep(1.0)
                now = time.time()
                if now - start > args.timeout_s:
                    stop(process)
                    break
                if now - last_note >= PROGRESS_S:
                    steps = orchestrator_steps(read_metrics(run_dir / "metrics.jsonl"))
                    print(f"{mode}: {now - start:.0f} s, {len(steps)}/{args.steps} steps", flush=True)
                    last_note = now
        except BaseException:  # Ctrl-C reaches only this process: rl runs in its own session
            stop(process)
            raise
    end = time.time()
    rows = read_metrics(run_dir / "metrics.jsonl")
    if process.returncode != 0:
        tail = (work / f"{mode}.log").read_text()[-3000:]
        timed_out = end - start > args.timeout_s
        why = f"timed out after {args.timeout_s:.0f} s" if timed_out else f"exit {process.returncode}"
        print(f"{mode}: rl failed ({why}); the end of its output:\n{tail}", file=sys.stderr, flush=True)
        if not orchestrator_steps(rows):
            raise SystemExit(1)
    result = {"mode": mode, "rl_exit": process.returncode, "load_before": [round(x, 2) for x in load],
              **summarize(rows, start, end)}
    return result, rows, start


def summarize(rows: list[dict], start: float, end: float) -> dict:
    steps = orchestrator_steps(rows)
    rewards = [r["reward/mean"] for r in steps]
    first_turn = [r.get(FIRST) for r in steps]
    steps_s = steps[-1]["time"] - steps[0]["time"] if len(steps) > 1 else None
    samples = sum(r.get("rollout/num_samples", 0) for r in steps[1:])
    result = {
        "wall_s": round(end - start, 1),
        "first_step_s": round(steps[0]["time"] - start, 1) if steps else None,
        "steps": len(steps),
        "steps_s": round(steps_s, 1) if steps_s else None,
        "samples_per_s": round(samples / steps_s, 1) if steps_s else None,
        "stale_groups": int(sum(r.get("async/stale_groups", 0) for r in steps)),
        "first_reward": round(rewards[0], 4) if rewards else None,
        "first_turn_step0": round(first_turn[0], 4) if first_turn and first_turn[0] is not None else None,
        "final_reward": round(statistics.fmean(rewards[-WINDOW:]), 4) if rewards else None,
        "final_first_turn": (round(statistics.fmean(x for x in first_turn[-WINDOW:] if x is not None), 4)
                             if any(x is not None for x in first_turn[-WINDOW:]) else None),
    }
    for source, keys in MEDIANS.items():
        for key in keys:
            values = [r[key] for r in rows if r.get("source") == source and key in r]
            result[f"{source} {key}"] = round(statistics.median(values), 3) if values else None
    return result


def step0_start(rows: list[dict]) -> float | None:
    """When the orchestrator started step 0 (its metrics line's time minus the step's duration)."""
    steps = orchestrator_steps(rows)
    return steps[0]["time"] - steps[0].get("perf/step_time_s", 0.0) if steps else None


def markdown(results: list[dict], gains: list[float]) -> str:
    columns = [*TABLE[:4], *((f"to +{g:.2f} s", f"+{g:.2f}") for g in gains), *TABLE[4:]]

    def cell(result: dict, key: str) -> str:
        value = result["time_to_gain_s"].get(key, "-") if key.startswith("+") else result.get(key)
        return "-" if value is None else str(value)

    lines = ["| " + " | ".join(name for name, _ in columns) + " |",
             "|" + "|".join("---" if key == "mode" else "---:" for _, key in columns) + "|"]
    lines += ["| " + " | ".join(cell(result, key) for _, key in columns) + " |" for result in results]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=18, help="max_steps of each run")
    parser.add_argument("--modes", default="step,continuous", help="rollout modes to run, in this order")
    parser.add_argument("--batch-size", type=int, default=512, help="rollouts per step (orchestrator.batch_size)")
    parser.add_argument("--rollouts-per-example", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help="orchestrator.client.max_concurrency (default: twice the prompts of a step)")
    parser.add_argument("--max-async-level", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--turns-alpha", type=float, default=2.0, help="Pareto index of the turns per episode")
    parser.add_argument("--most-turns", type=int, default=6, help="the cap on turns per episode")
    parser.add_argument("--reply-latency-s", type=float, default=0.3,
                        help="seconds before each environment reply (a slow tool or user)")
    parser.add_argument("--gains", default="0.02,0.03,0.04",
                        help="first-turn reward gains over the baseline to time (comma-separated)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="stop a run (SIGINT) after this long")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the runs' output directories, configs and logs go (default: a temporary "
                             "directory, deleted afterwards)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results (a JSON list) here")
    parser.add_argument("rl_args", nargs="*", help="extra rl arguments for both runs (after --)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    gains = [float(g) for g in args.gains.split(",")]
    if args.batch_size % args.rollouts_per_example:
        parser.error("--batch-size must be a multiple of --rollouts-per-example")

    with tempfile.TemporaryDirectory(prefix="continuous_heavy_tail_") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs = [run_mode(args, mode, work) for mode in modes]
    step0 = [result["first_turn_step0"] for result, _, _ in runs if result["first_turn_step0"] is not None]
    baseline = statistics.fmean(step0) if step0 else 0.0
    results = []
    for result, rows, start in runs:
        result = {**result, "baseline_first_turn": round(baseline, 4),
                  "time_to_gain_s": time_to_gains(rows, step0_start(rows), gains, FIRST, baseline),
                  "time_to_gain_from_launch_s": time_to_gains(rows, start, gains, FIRST, baseline)}
        print(json.dumps(result), flush=True)
        results.append(result)
    print(markdown(results, gains), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

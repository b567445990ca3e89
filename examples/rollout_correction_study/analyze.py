"""Analysis of the rollout-correction study: reward, drift and staleness of every run, from its metrics.jsonl.

For every async level k and objective it reads `outputs/rollout_correction_study/async<k>/<name>/metrics.jsonl`
with `prime_rl.run_report.MetricsTail` and reports, per run:

- the orchestrator's `reward/mean` of batch 0, the mean over the last 5 batches, and the gain between them;
- the trainer's `loss/mismatch_kl` (k3 of the surrogate's ratio r on the last of the step's 2 passes; r is
  pi / mu for `default` and `dppo`, pi / pi_old for the four corrected objectives), mean over the steps;
- where the correction stage is active: `correction/kl` (k1 estimate of KL(mu || pi_old), the sampler against
  the policy the trainer recomputed before the step's first update), the mean importance weight
  `correction/is_weight`, the share of tokens whose weight was truncated or zeroed
  (`correction/is_weight_truncated_frac`) and the share of tokens rejected (`correction/rejected_frac`);
- the staleness of the batches: the orchestrator's `async/policy_lag_mean` (per rollout: the step minus the
  weight step that sampled it), mean over the steps and its maximum.

Writes `results.md` (the summary table and a per-step reward table) and `reward.png` (reward curves, one panel
per async level) into the output folder.

    uv run python examples/rollout_correction_study/analyze.py [--runs-root outputs/rollout_correction_study]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from prime_rl.run_dir import metrics_file
from prime_rl.run_report import MetricsTail

RUNS = {  # objective (TOML and output folder name) -> what it trains with
    "default": "AIPO masked IS (prime-rl default), no correction",
    "grpo": "grpo (PPO clip on pi / mu), no correction: the control",
    "tis": "grpo + decoupled_token_is (TIS, C = 2)",
    "icepop": "grpo + decoupled_token_icepop ([0.5, 5])",
    "geo_rs": "grpo + decoupled_geo_rs ([0.999, 1.001])",
    "decoupled_ppo": "grpo + decoupled, untruncated token IS",
    "dppo": "DPPO (upstream default), no correction",
}
ASYNC_LEVELS = (2, 4)
LAST = 5  # the reward at the end: mean of the last LAST steps

COLUMNS = {  # row key -> (source, metric); averaged over the steps where it is logged
    "mismatch_kl": ("trainer", "loss/mismatch_kl"),
    "correction_kl": ("trainer", "correction/kl"),
    "is_weight": ("trainer", "correction/is_weight"),
    "truncated_frac": ("trainer", "correction/is_weight_truncated_frac"),
    "rejected_frac": ("trainer", "correction/rejected_frac"),
    "policy_lag": ("orchestrator", "async/policy_lag_mean"),
}


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def read_run(path: Path) -> MetricsTail:
    """The metrics of a run directory (or of a metrics.jsonl file itself)."""
    tail = MetricsTail(path if path.suffix == ".jsonl" else metrics_file(path))
    tail.poll()
    return tail


def summarize(tail: MetricsTail) -> dict[str, float | list[float]]:
    """One run's row: reward at step 0, mean of the last LAST steps, gain; the COLUMNS' means (nan where not
    logged); the largest policy lag; and the per-step rewards (`steps`, `reward`) for the curves."""
    rewards = tail.get("orchestrator", "reward/mean")
    steps = sorted(rewards)
    reward = [rewards[s] for s in steps]
    row: dict[str, float | list[float]] = {"steps": steps, "reward": reward}
    row["reward_0"] = reward[0] if reward else math.nan
    row["reward_last"] = mean(reward[-LAST:])
    row["gain"] = row["reward_last"] - row["reward_0"]
    for key, (source, name) in COLUMNS.items():
        row[key] = mean(list(tail.get(source, name).values()))
    row["policy_lag_max"] = max(tail.get("orchestrator", "async/policy_lag_max").values(), default=math.nan)
    return row


def fmt(x: float, spec: str) -> str:
    return "-" if math.isnan(x) else format(x, spec)


def summary_table(results: dict[int, dict[str, dict]]) -> str:
    """The summary as markdown: one row per (async level, objective)."""
    lines = [
        "| async | run | objective | reward step 0 | reward, mean last 5 | gain | `loss/mismatch_kl` | "
        "`correction/kl` | IS weight | weight truncated / zeroed | rejected | policy lag mean (max) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, runs in results.items():
        for name, r in runs.items():
            lines.append(
                f"| {k} | `{name}` | {RUNS.get(name, name)} | {fmt(r['reward_0'], '.3f')} "
                f"| {fmt(r['reward_last'], '.3f')} | {fmt(r['gain'], '+.3f')} | {fmt(r['mismatch_kl'], '.3g')} "
                f"| {fmt(r['correction_kl'], '.3g')} | {fmt(r['is_weight'], '.3f')} "
                f"| {fmt(r['truncated_frac'], '.1%')} | {fmt(r['rejected_frac'], '.1%')} "
                f"| {fmt(r['policy_lag'], '.2f')} ({fmt(r['policy_lag_max'], '.0f')}) |")
    return "\n".join(lines) + "\n"


def step_table(results: dict[int, dict[str, dict]], every: int = 5) -> str:
    """Reward of every `every`-th step (and the last), one column per run."""
    cols = [(k, name) for k, runs in results.items() for name in runs]
    all_steps = sorted({s for k, name in cols for s in results[k][name]["steps"]})
    shown = [s for s in all_steps if s % every == 0 or s == all_steps[-1]]
    lines = ["| step | " + " | ".join(f"async{k} `{name}`" for k, name in cols) + " |",
             "|---:|" + "---:|" * len(cols)]
    for s in shown:
        cells = []
        for k, name in cols:
            r = results[k][name]
            cells.append(fmt(r["reward"][r["steps"].index(s)], ".3f") if s in r["steps"] else "-")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def moving_average(xs: list[float], n: int) -> list[float]:
    return [mean(xs[max(0, i - n + 1): i + 1]) for i in range(len(xs))]


def plot(results: dict[int, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), sharey=True, squeeze=False)
    for ax, (k, runs) in zip(axes[0], results.items(), strict=True):
        for i, (name, r) in enumerate(runs.items()):
            color = f"C{i}"
            ax.plot(r["steps"], r["reward"], color=color, alpha=0.25, lw=1)
            ax.plot(r["steps"], moving_average(r["reward"], LAST), color=color, lw=2, label=name)
        ax.set(xlabel="step", title=f"max_async_level = {k}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"reward/mean (faint: per step; solid: mean of the last {LAST})")
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    here = Path(__file__).parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-root", type=Path, default=Path("outputs/rollout_correction_study"))
    parser.add_argument("--runs", nargs="+", default=list(RUNS))
    parser.add_argument("--async-levels", nargs="+", type=int, default=list(ASYNC_LEVELS))
    parser.add_argument("--out", type=Path, default=here)
    args = parser.parse_args()
    results = {k: {name: summarize(read_run(args.runs_root / f"async{k}" / name)) for name in args.runs}
               for k in args.async_levels}
    text = summary_table(results) + "\nReward per step:\n\n" + step_table(results)
    (args.out / "results.md").write_text(text)
    plot(results, args.out / "reward.png")
    print(text)
    print(f"wrote {args.out / 'results.md'} and {args.out / 'reward.png'}")


if __name__ == "__main__":
    main()

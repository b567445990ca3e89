"""Analysis of the IS-reshape study: how far each step's 16 updates moved the policy, and the reward.

For every run and step N it loads the batch `rollouts/step_N/rank_0.pt` (the behaviour policy's tokens
and their logprobs `lq`, as the inference server sampled them) and the weights the trainer published
after the step's last update, `weights/step_{N+1}`, scores the sampled tokens with the trainer's own
`compute_logprobs` under the batch's sampling rule (temperature, truncation) to get `lp`, and reports

    KL_N = mean over trained tokens of  k3(d) = exp(d) - d - 1,   d = clamp(lp - lq, -20, 20)

the estimator of `loss/mismatch_kl` (src/prime_rl/trainer/rl/loss.py). The tokens are sampled from the
behaviour policy q, so E_q[k3] = KL(q || pi_final): the KL between the behaviour and the final policy.
Unlike `loss/mismatch_kl`, which the trainer logs on the last of the 16 passes (before its update),
this is the policy after all 16 updates. As a check the same is computed with `weights/step_N`, the
behaviour policy itself: with `max_async_level = 0` it must be ~0.

The reward of step N is the orchestrator's `reward/mean` in metrics.jsonl (the batch sampled by
`weights/step_N`). Writes `results.md` (tables) and `kl_reward.png` into the output folder.

    uv run python examples/is_reshape_study/analyze.py [--runs-root outputs/is_reshape_study]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import transformers

from prime_rl.batch_format import read_rank
from prime_rl.configs.shared import ModelConfig
from prime_rl.run_dir import metrics_file, weights_dir
from prime_rl.trainer.config import RuntimeConfig
from prime_rl.trainer.model import compute_logprobs, load_model
from prime_rl.trainer.rl.losses import LOG_RATIO_BOUND

RUNS = {  # output folder name -> what it trains with
    "vanilla": "vanilla IS-PG, no clip",
    "clip": "clipped PPO (bnpo, eps 0.2)",
    "is_reshape": "is_reshape (defaults)",
}


def k3_kl(lp: torch.Tensor, lq: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of k3 = exp(d) - d - 1, d = clamp(lp - lq, -B, B) (B = 20), over the tokens of `mask` where
    both logprobs are finite: `loss/mismatch_kl`'s estimate of KL(q || p) for tokens sampled from q."""
    keep = mask.bool() & torch.isfinite(lp) & torch.isfinite(lq)
    d = (lp.double() - lq.double())[keep].clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return float((torch.exp(d) - d - 1).mean()) if d.numel() else math.nan


def load_policy(run: Path, step: int) -> torch.nn.Module:
    """`weights/step_{step}` of a run, loaded as the trainer loads a model (float32 on CPU, sdpa)."""
    model = load_model(ModelConfig(name=str(weights_dir(run, step))), RuntimeConfig(), torch.device("cpu"))
    return model.eval()


@torch.no_grad()
def batch_kl(model: torch.nn.Module, run: Path, step: int) -> float:
    """k3 KL between the sampler of batch `step` (its logprobs) and `model`, scored as the trainer scores it."""
    batch = read_rank(run, step, 0)
    lp, lq, mask = [], [], []
    for mb in batch.micro_batches:
        lp.append(compute_logprobs(model, mb.input_ids, mb.position_ids, mb.sample_lens, batch.rule)[0])
        lq.append(mb.inference_logprobs)
        mask.append(mb.loss_mask)
    return k3_kl(torch.cat(lp), torch.cat(lq), torch.cat(mask))


def read_metrics(run: Path) -> dict[str, dict[int, float]]:
    """Per step: the orchestrator's reward and the trainer's `loss/mismatch_kl` (last pass)."""
    out: dict[str, dict[int, float]] = {"reward": {}, "mismatch_kl": {}}
    for line in metrics_file(run).read_text().splitlines():
        row = json.loads(line)
        if row["source"] == "orchestrator" and "reward/mean" in row:
            out["reward"][row["step"]] = row["reward/mean"]
        if row["source"] == "trainer" and "loss/mismatch_kl" in row:
            out["mismatch_kl"][row["step"]] = row["loss/mismatch_kl"]
    return out


def analyze(run: Path) -> dict[str, list[float]]:
    """Per trained step N: final KL, reward, the trainer's last-pass mismatch_kl; and the behaviour check.

    `weights/step_k` is loaded once: it is the final policy of batch k - 1 and the behaviour policy of batch k.
    """
    metrics = read_metrics(run)
    steps = sorted(metrics["mismatch_kl"])
    kl_final, kl_check = [], []
    for n in steps:
        model = load_policy(run, n + 1)
        kl_final.append(batch_kl(model, run, n))
        if n + 1 in steps:
            kl_check.append(batch_kl(model, run, n + 1))
    return {
        "step": steps,
        "kl_final": kl_final,
        "kl_check": kl_check,
        "reward": [metrics["reward"][n] for n in steps],
        "mismatch_kl": [metrics["mismatch_kl"][n] for n in steps],
    }


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def tables(results: dict[str, dict[str, list[float]]]) -> str:
    """A summary table (one row per run) and a per-step table, as markdown."""
    lines = [
        "| run | loss | final KL step 0 | final KL, mean steps 0-4 | final KL, mean last 5 | final KL, mean all "
        "| final KL, max (step) | last-pass `mismatch_kl`, mean all | reward step 0 | reward, mean last 5 | gain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        kl, rew = r["kl_final"], r["reward"]
        top = max(range(len(kl)), key=kl.__getitem__)
        lines.append(
            f"| `{name}` | {RUNS.get(name, name)} | {kl[0]:.3g} | {mean(kl[:5]):.3g} | {mean(kl[-5:]):.3g} "
            f"| {mean(kl):.3g} "
            f"| {kl[top]:.3g} ({r['step'][top]}) | {mean(r['mismatch_kl']):.3g} | {rew[0]:.3f} "
            f"| {mean(rew[-5:]):.3f} | {mean(rew[-5:]) - rew[0]:+.3f} |")
    checks = {name: max((abs(x) for x in r["kl_check"]), default=math.nan) for name, r in results.items()}
    lines += ["", "Check, the behaviour policy against its own batch (`weights/step_N` on `rollouts/step_N`, "
              "N >= 1), max |KL| over the steps: " + ", ".join(f"`{n}` {v:.1e}" for n, v in checks.items()), ""]
    names = list(results)
    lines.append("| step | " + " | ".join(f"`{n}` final KL | `{n}` reward" for n in names) + " |")
    lines.append("|---:|" + "---:|---:|" * len(names))
    for i, step in enumerate(results[names[0]]["step"]):
        cells = [f"{results[n]['kl_final'][i]:.3g} | {results[n]['reward'][i]:.3f}" for n in names
                 if i < len(results[n]["step"])]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_kl, ax_rew) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in results.items():
        ax_kl.plot(r["step"], r["kl_final"], marker=".", label=RUNS.get(name, name))
        ax_rew.plot(r["step"], r["reward"], marker=".", label=RUNS.get(name, name))
    ax_kl.set(yscale="log", xlabel="step N", ylabel="KL(behaviour || final), k3, nats/token",
              title="KL after the step's 16 updates")
    ax_rew.set(xlabel="step N", ylabel="mean reward of batch N", title="reward")
    for ax in (ax_kl, ax_rew):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    here = Path(__file__).parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-root", type=Path, default=Path("outputs/is_reshape_study"))
    parser.add_argument("--runs", nargs="+", default=list(RUNS))
    parser.add_argument("--out", type=Path, default=here)
    args = parser.parse_args()
    torch.set_num_threads(2)
    transformers.utils.logging.disable_progress_bar()
    results = {name: analyze(args.runs_root / name) for name in args.runs}
    text = tables(results)
    (args.out / "results.md").write_text(text)
    plot(results, args.out / "kl_reward.png")
    print(text)
    print(f"wrote {args.out / 'results.md'} and {args.out / 'kl_reward.png'}")


if __name__ == "__main__":
    main()

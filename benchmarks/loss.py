"""Micro-benchmark of every loss variant: forward + backward on one packed micro-batch.

    uv run python benchmarks/loss.py                      # 256 samples x 512 tokens, CPU, 1 thread
    uv run python benchmarks/loss.py --threads 2 --device cuda --samples 256 --tokens 512

Prints one markdown table row per variant (median of --repeats runs after one warm-up).
The losses are vectorized over samples (segment sums), so time grows with tokens, not samples.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale, scale_counts

VARIANTS = ["default", "sapo", "cispo", "vanilla", "grpo", "bnpo", "dr_grpo", "dapo", "gspo", "gspo_token", "fipo",
            "is_reshape"]  # fmt: skip
CORRECTIONS = ["decoupled_token_is", "decoupled_seq_is_rs", "decoupled_geo_rs_token_tis", "decoupled_k3_rs"]
"""`grpo` with each of these `[loss.correction]` presets: what the correction stage adds to the loss's own time."""


def make_batch(samples: int, tokens: int, device: str) -> LossInputs:
    generator = torch.Generator().manual_seed(0)
    total = samples * tokens
    lq = -torch.rand(total, generator=generator) * 3
    lp = (lq + 0.2 * torch.randn(total, generator=generator)).to(device).requires_grad_()
    adv = torch.repeat_interleave(torch.randn(samples, generator=generator), tokens)
    mask = torch.rand(total, generator=generator) > 0.1
    return LossInputs(
        lp,
        lq.to(device),
        adv.to(device),
        mask.to(device),
        torch.full((samples,), tokens, device=device),
        ref_logprobs=(lq + 0.05).to(device),
        old_logprobs=(lq + 0.1 * torch.randn(total, generator=generator)).to(device),
    )


def time_variant(variant: str, batch: LossInputs, repeats: int, kl: bool, correction: str | None = None) -> float:
    scale = LossScale.from_counts(scale_counts(batch), max_tokens=int(batch.sample_lens.max()))
    config = {"type": variant, "kl_coef": 0.01 if kl else 0.0}
    if correction is not None:
        config["correction"] = {"preset": correction}
    loss_fn = build_loss(config)
    if loss_fn.needs_step_pass:  # the trainer's no-grad pre-pass (not timed: it is a model forward there)
        scale = loss_fn.with_step_statistics(scale, loss_fn.step_statistics(batch))
    times = []
    for i in range(repeats + 1):
        if batch.trainer_logprobs.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = loss_fn(batch, scale)
        out.loss.backward()
        if batch.trainer_logprobs.is_cuda:
            torch.cuda.synchronize()
        if i:  # the first run is a warm-up
            times.append(time.perf_counter() - start)
        batch.trainer_logprobs.grad = None
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per sample")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kl", action="store_true", help="add the k3 KL-to-reference term")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = make_batch(args.samples, args.tokens, args.device)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} thread(s)"
    print(f"{args.samples} samples x {args.tokens} tokens, forward + backward, median of {args.repeats}, {name}")
    print("| loss | ms |\n|---|---:|")
    for variant in VARIANTS:
        print(f"| {variant} | {1000 * time_variant(variant, batch, args.repeats, args.kl):.1f} |", flush=True)
    for preset in CORRECTIONS:
        ms = 1000 * time_variant("grpo", batch, args.repeats, args.kl, preset)
        print(f"| grpo + correction `{preset}` | {ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()

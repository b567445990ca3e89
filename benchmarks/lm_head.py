"""The trainer's LM head alone: logprobs + entropies of T tokens and their backward, chunked
(`trainer/chunked_logprobs.py`) against the full [T, V] logits, on the current device.

    uv run python benchmarks/lm_head.py                                   # GPU: bf16, H = 2048, V = 151,936
    uv run python benchmarks/lm_head.py --tokens 4096,16384 --chunk-elements 33554432,268435456

Reports per (T, path): median forward+backward seconds over `--repeats` after one warm-up, and the peak
memory the call added (CUDA: max_memory_allocated; CPU: not measured). A no-truncation rule at T = 1.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import torch

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer import chunked_logprobs as lm_head


def full(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(torch.nn.functional.linear(h, w).float()[:, :vocab], dim=-1)
    return logp.gather(-1, targets[:, None])[:, 0], -(logp.exp() * logp).sum(-1)


def chunked(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, rule: SamplingRule,
            chunk_elements: int) -> tuple[torch.Tensor, torch.Tensor]:
    chunk = lm_head.chunk_tokens(w.shape[0], chunk_elements or None, h.device)
    return lm_head.token_stats(h, w, None, targets, rule, chunk=chunk)


def measure(fn, h, w, repeats: int) -> tuple[float, float | None]:
    times, peak = [], None
    for i in range(repeats + 1):
        h.grad = w.grad = None
        if h.is_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if h.is_cuda else 0
        start = time.perf_counter()
        lp, ent = fn()
        (lp.sum() + 0.01 * ent.sum()).backward()
        if h.is_cuda:
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--sampled-vocab", type=int, default=151_669)
    parser.add_argument("--chunk-elements", default="0", help="comma-separated; 0: the device's default")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-full", action="store_true", help="skip the full-logits path (too big for the device)")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    w = (torch.randn(args.vocab, args.hidden, generator=g, device=device) * 0.02).to(dtype).requires_grad_()
    rule = SamplingRule(vocab=args.sampled_vocab)
    for tokens in (int(t) for t in args.tokens.split(",")):
        h = torch.randn(tokens, args.hidden, generator=g, device=device).to(dtype).requires_grad_()
        targets = torch.randint(0, args.sampled_vocab, (tokens,), generator=g, device=device)
        runs = [(f"chunked {c}", functools.partial(chunked, h, w, targets, rule, int(c)))
                for c in args.chunk_elements.split(",")]
        if not args.no_full:
            runs.append(("full", functools.partial(full, h, w, targets, args.sampled_vocab)))
        for name, fn in runs:
            try:
                seconds, peak = measure(fn, h, w, args.repeats)
                row = {"tokens": tokens, "path": name, "seconds": round(seconds, 4),
                       "peak_gib": None if peak is None else round(peak, 2)}
            except torch.OutOfMemoryError:
                row = {"tokens": tokens, "path": name, "out_of_memory": True}
                torch.cuda.empty_cache()
            print(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                              "hidden": args.hidden, **row}), flush=True)


if __name__ == "__main__":
    main()

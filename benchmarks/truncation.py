"""What scoring tokens under the sampler's truncation costs the trainer, per token, against the plain softmax.

    uv run python benchmarks/truncation.py [--tokens 512] [--vocab 32000 151936] [--repeats 3]

For random logits [tokens, vocab] it times `trainer.model.token_logprobs` forward + backward (logprobs and
entropies, as the RL step computes them) with no truncation, top_k, min_p and top_p (top_p sorts the
vocabulary of every token), and prints milliseconds per call and the ratio to the untruncated one.
"""

from __future__ import annotations

import argparse
import time

import torch

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer.model import token_logprobs

RULES = {"none": SamplingRule(), "top_k=20": SamplingRule(top_k=20), "min_p=0.05": SamplingRule(min_p=0.05),
         "top_p=0.9": SamplingRule(top_p=0.9), "all three": SamplingRule(top_k=20, top_p=0.9, min_p=0.05)}


def time_rule(logits: torch.Tensor, ids: torch.Tensor, rule: SamplingRule, repeats: int) -> float:
    lens = torch.tensor([ids.numel()])
    best = float("inf")
    for _ in range(repeats):
        leaf = logits.detach().requires_grad_(True)
        start = time.perf_counter()
        lp, ent = token_logprobs(leaf, ids, lens, rule)
        (lp.sum() + ent.sum()).backward()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.tokens} tokens, best of "
          f"{args.repeats}")
    for vocab in args.vocab:
        gen = torch.Generator().manual_seed(0)
        logits = torch.randn(args.tokens, vocab, generator=gen) * 3
        ids = torch.randint(0, vocab, (args.tokens,), generator=gen)
        base = None
        for name, rule in RULES.items():
            ms = time_rule(logits, ids, rule, args.repeats)
            base = base or ms
            print(f"vocab {vocab:>7}  {name:<11} {ms:9.1f} ms  x{ms / base:.2f}")


if __name__ == "__main__":
    main()

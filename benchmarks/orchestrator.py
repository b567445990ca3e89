"""Orchestrator overhead per step, without a server: scoring, advantages, packing, writing.

    uv run python benchmarks/orchestrator.py [--samples 512] [--world-size 1]

Prints milliseconds per phase for one reverse-text step of `--samples` rollouts (groups of 8),
so the orchestrator's own cost can be compared with generation and training time.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time

import torch

from prime_rl.advantages.group import grpo
from prime_rl.batch_format import write_step
from prime_rl.envs import load_env
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.batch import Sample, pack_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=2048)
    args = parser.parse_args()
    rng = random.Random(0)
    env = load_env("reverse-text")
    examples = env.examples(seed=0)
    groups = [next(examples) for _ in range(args.samples // 8)]
    texts = [["".join(rng.choices("abcdefghijklmnop", k=rng.randint(5, 14))) for _ in range(8)] for _ in groups]

    async def score_all():
        return [[(await env.score(ex, t)).total for t in row] for ex, row in zip(groups, texts, strict=True)]

    timings = {}
    start = time.perf_counter()
    rewards = torch.tensor(asyncio.run(score_all()))
    timings["score"] = time.perf_counter() - start
    start = time.perf_counter()
    advantages = grpo(rewards)
    timings["advantages"] = time.perf_counter() - start
    samples = [
        Sample([1] * 57, [ord(c) for c in t] + [2], [-0.5] * (len(t) + 1), float(a), 0)
        for row, adv in zip(texts, advantages.tolist(), strict=True) for t, a in zip(row, adv, strict=True)
    ]
    start = time.perf_counter()
    batches = pack_batch(samples, args.seq_len, args.world_size, 0, SamplingRule(), 32)
    timings["pack"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_step(tmp, 0, batches)
        timings["write"] = time.perf_counter() - start
    rows = len(batches[0].micro_batches)
    print(f"{args.samples} samples, {rows} micro-batches per rank x {args.world_size} ranks")
    for name, seconds in timings.items():
        print(f"  {name:<10} {seconds * 1000:8.1f} ms")


if __name__ == "__main__":
    main()

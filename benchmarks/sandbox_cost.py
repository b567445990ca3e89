"""What scoring code costs: one `code_tests`-style evaluation (a one-line program against 4 stdin/stdout cases) in
each sandbox level this machine has, one at a time and `--concurrency` at once.

    uv run python benchmarks/sandbox_cost.py [--evaluations 64] [--cases 4] [--concurrency 4] [--repeats 3]

Reports milliseconds of wall time per evaluation (the median of `--repeats`), with a bare `python -I -S -c pass`
start measured in the same run as the reference: the floor every level pays once per evaluation.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from prime_rl.sandbox import Limits, LocalSandbox  # noqa: E402
from prime_rl.sandbox.local import level_works  # noqa: E402

PROGRAM = "print(input()[::-1].upper())"


async def evaluate(sandbox: LocalSandbox, cases: list[dict], evaluations: int) -> float:
    async def one():
        return [r async for r in sandbox.run(PROGRAM, cases)]

    start = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(evaluations)))
    elapsed = time.perf_counter() - start
    assert all(r.stdout == "FEDCBA\n" for rs in results for r in rs)
    return elapsed / evaluations * 1000


def python_start_ms(repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=64)
    parser.add_argument("--cases", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cases = [{"kind": "stdio", "stdin": "abcdef\n"}] * args.cases
    print(f"reference: python -I -S -c pass starts in {python_start_ms():.1f} ms")
    for level in ("bwrap", "unshare", "none"):
        why = level_works(level, sys.executable)
        if why:
            print(f"{level:8s} not available: {why}")
            continue
        row = []
        for concurrency in (1, args.concurrency):
            sandbox = LocalSandbox(level, Limits(timeout_s=5.0), max_concurrency=concurrency)
            ms = [asyncio.run(evaluate(sandbox, cases, args.evaluations)) for _ in range(args.repeats)]
            row.append(f"{statistics.median(ms):6.1f} ms/evaluation at concurrency {concurrency}")
        print(f"{level:8s} " + ", ".join(row))


if __name__ == "__main__":
    main()

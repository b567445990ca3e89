"""How fast this machine is today: the reference beside which the suite's and the examples' times are given.

    uv run python benchmarks/machine_speed.py

Machines of one kind differ by up to ~1.8x from day to day, so a time measured here means little alone. This
measures, single-threaded and in a few seconds, the work the suite and a small `rl` run spend their time on:

- `import`: a fresh `python -c "import torch; from transformers import AutoTokenizer"` (every process the suite
  starts pays it);
- `python`: an interpreter loop (the event loops, packing, config and test code);
- `torch`: small float32 matmuls and a log-softmax (the tiny models' forward and backward).

Prints one line, `machine speed: import X s, python Y s, torch Z s` (medians of --repeats; lower is faster), which
`.ci/run` prints before the tests, so every CI log carries the reference of its own run. docs/benchmarks.md and
DEVELOPERS.md give the suite's times beside it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

IMPORTS = "import torch; from transformers import AutoTokenizer"


def import_seconds() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True)
    return time.perf_counter() - start


def python_seconds() -> float:
    start = time.perf_counter()
    total = 0
    for i in range(3_000_000):
        total += i % 7
    return time.perf_counter() - start


def torch_seconds() -> float:
    import torch

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=generator)
    b = torch.randn(256, 4096, generator=generator)
    start = time.perf_counter()
    for _ in range(20):
        torch.log_softmax(a @ b, dim=-1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement (the median is printed)")
    args = parser.parse_args()
    figures = {name: statistics.median(measure() for _ in range(args.repeats))
               for name, measure in (("import", import_seconds), ("python", python_seconds), ("torch", torch_seconds))}
    print("machine speed: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in figures.items()))


if __name__ == "__main__":
    main()

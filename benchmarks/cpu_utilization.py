"""How close an rl run's trainer and generation come to the CPU's limit (docs/benchmarks.md, "SmolLM2").

    uv run python benchmarks/cpu_utilization.py --run outputs/smollm2 [--threads 1]

- `gemm`: the cores' measured fp32 matrix-multiply peak, the best of square matmuls (1024..4096) at `--threads`
  (the trainer's `trainer.runtime.threads`): the ceiling any fp32 training step can reach;
- `trainer`: the run's achieved FLOP/s, its median perf/tokens_per_s x FLOPs per token (`trainer/perf.py`: 6 N plus
  the attention's 12 L H s at a context of `--context` tokens, about the example's sample length), and its share of
  the peak: the CPU's MFU;
- `forward`: one forward of the model over a batch of 64 single tokens at a context of `--context` (a decode
  step's cost), as tokens/s, to hold beside the run's perf/inference_tokens_per_s.

Run it on a quiet machine, after the run (it reads the run's metrics.jsonl and loads its model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def gemm_flops(threads: int, sizes=(1024, 2048, 4096), repeats: int = 3) -> float:
    """Best fp32 FLOP/s of an n x n x n matmul over `sizes` (2 n^3 FLOPs each)."""
    torch.set_num_threads(threads)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def trainer_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("source") == "trainer" and "perf/tokens_per_s" in r]


def decode_tokens_per_s(model_dir: str, threads: int, batch: int = 64, context: int = 64) -> float:
    """Tokens/s of forwards of `batch` single tokens after a `context`-token prefix in the KV cache."""
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (batch, context))
    with torch.no_grad():
        cache = DynamicCache()
        model(ids, past_key_values=cache, use_cache=True)
        times = []
        for _ in range(8):
            start = time.perf_counter()
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
    return batch / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="an rl run's output_dir")
    parser.add_argument("--threads", type=int, default=1, help="the trainer's torch threads")
    parser.add_argument("--context", type=int, default=64, help="prompt + answer tokens of a decode step")
    args = parser.parse_args()
    from transformers import AutoConfig

    from prime_rl.models.embedded import resolve_model_path
    from prime_rl.trainer.perf import flops_per_token

    recorded = (args.run / "configs" / "trainer.toml").read_text()
    import tomllib

    name = tomllib.loads(recorded)["model"]["name"]
    path = resolve_model_path(name)
    config = AutoConfig.from_pretrained(path)
    rows = trainer_rows(args.run)[1:]  # step 0 pays the warm-up
    tokens_per_s = statistics.median(r["perf/tokens_per_s"] for r in rows)
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    per_token = flops_per_token(params, config, args.context)
    peak = gemm_flops(args.threads)
    achieved = tokens_per_s * per_token
    print(f"model {name}: {params / 1e6:.1f}M parameters, {per_token / 1e9:.2f} GFLOP per trained token")
    print(f"gemm peak (fp32, {args.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s")
    print(f"trainer: {tokens_per_s:.0f} tokens/s (median of {len(rows)} steps) = {achieved / 1e9:.1f} GFLOP/s, "
          f"{achieved / peak:.0%} of the peak")
    decode = decode_tokens_per_s(path, args.threads, 64, args.context)
    print(f"forward of 64 single tokens (a decode step): {decode:.0f} tokens/s")


if __name__ == "__main__":
    main()

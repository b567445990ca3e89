"""Trainer memory and speed at a real vocabulary: a tiny random Qwen3 (hidden 64, 2 layers) with Qwen3's real
tokenizer and its 151,936-row output embedding, trained on one long rollout per step.

    uv run python benchmarks/real_shape.py                              # rows of 1k, 4k, 8k, 16k tokens
    uv run python benchmarks/real_shape.py --row-lens 1024,4096 --full-logits   # the old [tokens, vocab] path

Each row length runs in a fresh process (so its peak RSS is its own): the model is written with the vendored
Qwen3 tokenizer (`tests/support/real_tokenizers.py`), `--steps` synthetic rollout batches of one sample (a
128-token prompt and the rest completion) are written, and the real RL trainer runs them in-process. Reported:
peak RSS of the process (`ru_maxrss`; on a GPU also the trainer's peak GPU memory), the median step time after
the first and tokens/s, and the growth of peak RSS per token between consecutive row lengths. `--full-logits`
scores from the model's full logits (the path every model took before `trainer/chunked_logprobs.py`) to measure the
difference.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = 128


def one(row_len: int, steps: int, full_logits: bool, chunk_elements: int | None) -> dict:
    sys.path.insert(0, str(ROOT))  # the repository root: tests.support
    import torch
    from tests.support.real_tokenizers import REAL_TOKENIZERS, save_tiny_model
    from tests.support.synthetic_batches import random_step, write_random_step

    from prime_rl.trainer import chunked_logprobs as lm_head
    from prime_rl.trainer import model as trainer_model
    from prime_rl.trainer.config import TrainerConfig
    from prime_rl.trainer.rl.train import train

    if full_logits:
        trainer_model.head_output_is_logits = lambda model: False
    if chunk_elements:
        lm_head.CHUNK_ELEMENTS = chunk_elements
    spec = REAL_TOKENIZERS["qwen3"]
    with tempfile.TemporaryDirectory(prefix="bench-real-shape-") as tmp:
        tmp = Path(tmp)
        save_tiny_model("qwen3", tmp / "model", max_position_embeddings=max(row_len, 4096))
        out = tmp / "run"
        for step in range(steps):
            write_random_step(out, step, 1, random_step(spec.tokenizer_len, step, 1, 1, PROMPT, row_len - PROMPT))
        config = TrainerConfig.build([], {
            "model": {"name": str(tmp / "model")}, "output_dir": str(out), "max_steps": steps, "seq_len": row_len,
            "wandb": {"mode": "disabled"}, "keep_weights": 1,
        })
        train(config)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r["source"] == "trainer"][1:]
    gpu = {"gpu": torch.cuda.get_device_name(), "peak_gpu_gib": max(r["perf/peak_memory_gib"] for r in timed)} \
        if torch.cuda.is_available() else {}
    return {"row_len": row_len, "full_logits": full_logits,
            "chunk_tokens": lm_head.chunk_tokens(
                spec.vocab_size, device=torch.device("cuda" if torch.cuda.is_available() else "cpu")),
            "threads": torch.get_num_threads(), **gpu,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "step_time_s": round(statistics.median(r["perf/step_time_s"] for r in timed), 2),
            "tokens_per_s": round(statistics.median(r["perf/tokens_per_s"] for r in timed))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row-lens", default="1024,4096,8192,16384")
    parser.add_argument("--steps", type=int, default=3, help="trainer steps per row length (the first is warm-up)")
    parser.add_argument("--full-logits", action="store_true", help="score from the full logits (the old path)")
    parser.add_argument("--chunk-elements", type=int, default=None,
                        help="logits per chunk (trainer/chunked_logprobs.py)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one row length
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, max(args.steps, 2), args.full_logits, args.chunk_elements)), flush=True)
        return
    previous = None
    for row_len in (int(n) for n in args.row_lens.split(",")):
        cmd = [sys.executable, __file__, "--one", str(row_len), "--steps", str(args.steps)]
        cmd += ["--chunk-elements", str(args.chunk_elements)] if args.chunk_elements else []
        done = subprocess.run(cmd + (["--full-logits"] if args.full_logits else []), capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            print(json.dumps({"row_len": row_len, "full_logits": args.full_logits, "failed": tail[0][:200],
                              "returncode": done.returncode}), flush=True)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if previous is not None:
            result["mb_per_token_since_previous"] = round(
                (result["peak_rss_mb"] - previous["peak_rss_mb"]) / (row_len - previous["row_len"]), 3)
        previous = result
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Throughput of the RL trainer step: tokens/s (and MFU on GPU) of `prime_rl.trainer.rl.train`.

    uv run python benchmarks/trainer.py                  # CPU: tiny (0.8M) and 50m presets
    uv run python benchmarks/trainer.py --preset 0.5b    # GPU: ~0.6B Qwen3 architecture, MFU
    uv run python benchmarks/trainer.py --preset tiny --steps 6 --micro-batches 8
    uv run python benchmarks/trainer.py --preset tiny --row-lens 256,1024,4096   # cost per token vs row length
    uv run python benchmarks/trainer.py --preset 50m --old-logprobs trainer --update-epochs 2   # decoupled's forward

Each preset writes a randomly initialised Qwen3-architecture model (char tokenizer; the
vocabulary is padded to the preset's size so the LM head costs what it would in a real
model) and synthetic rollout batches (`tests/support/synthetic_batches.py`) into a temporary
run directory, runs the real trainer in-process for `--steps` steps, and reports the
median over the steps after the first (warm-up) of `perf/step_time_s`,
`perf/tokens_per_s` and `perf/mfu` as the trainer itself logged them. Tokens are all
tokens of the packed rows (prompt + completion), forward + backward + optimizer step.

`--row-lens` repeats a preset with rows of each length (the same samples, as many per row
as fit, the same tokens per step) and adds `cost_per_token_vs_first`: what a token costs
relative to the first row length. Attention never crosses a sample (trainer/attention_layout.py),
so this should stay near 1.

`--old-logprobs trainer` runs the step with `[loss.correction] old_logprobs = "trainer"` (a no-grad forward of
the batch before its first update, decoupled PPO's pi_old) and `sampler` without it, both with `type = "grpo"`;
`peak_rss_mib` (the process's peak resident memory) and, on a GPU, `peak_cuda_mib` give the memory side. Run
each setting in its own process, alternating, for a before/after (docs/benchmarks.md#the-old-policy-forward).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.perf import num_parameters
from prime_rl.trainer.rl.train import train

# the repository root: tests.support, the test suite's batch generator
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.synthetic_batches import random_step, write_random_step  # noqa: E402


@dataclass(frozen=True)
class Preset:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    samples: int  # per micro-batch (packed row)
    prompt_len: int
    completion_len: int
    micro_batches: int


PRESETS = {
    # The embedded reverse-text model (hidden 128, 4 layers, char vocabulary).
    "tiny": Preset(128, 4, 4, 2, 384, 99, 8, 24, 40, 4),
    # ~50M parameters (32k vocabulary).
    "50m": Preset(512, 10, 8, 4, 1536, 32_000, 4, 64, 64, 2),
    # Qwen3-0.6B's shape (~0.6B parameters, 152k vocabulary): a GPU benchmark.
    "0.5b": Preset(1024, 28, 16, 8, 3072, 151_936, 8, 128, 384, 8),
}


def make_model(directory: Path, p: Preset) -> int:
    tokenizer = build_char_tokenizer()
    config = Qwen3Config(
        vocab_size=max(p.vocab, len(tokenizer)), hidden_size=p.hidden, intermediate_size=p.intermediate,
        num_hidden_layers=p.layers, num_attention_heads=p.heads, num_key_value_heads=p.kv_heads,
        head_dim=p.hidden // p.heads, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return num_parameters(model)


def run_preset(name: str, p: Preset, steps: int, micro_batches: int | None, old_logprobs: str | None = None,
               update_epochs: int = 1) -> dict:
    micro = micro_batches or p.micro_batches
    with tempfile.TemporaryDirectory(prefix=f"bench-trainer-{name}-") as tmp:
        tmp = Path(tmp)
        params = make_model(tmp / "model", p)
        out = tmp / "run"
        for step in range(steps):
            write_random_step(out, step, 1, random_step(p.vocab, step, micro, p.samples, p.prompt_len,
                                                        p.completion_len))
        config = TrainerConfig.build([], {
            "model": {"name": str(tmp / "model")}, "output_dir": str(out), "max_steps": steps,
            "seq_len": p.samples * (p.prompt_len + p.completion_len), "wandb": {"mode": "disabled"},
            "keep_weights": 1, "update_epochs": update_epochs,
            # the synthetic batches draw ids from every row of the padded vocabulary, as vLLM may sample them
            "sampled_vocab": "model",
            **({"loss": {"type": "grpo", "correction": {"old_logprobs": old_logprobs}}} if old_logprobs else {}),
        })
        train(config)
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [m for m in lines if m["source"] == "trainer"][1:] or lines
    result = {
        "preset": name,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "params_M": round(params / 1e6, 2),
        "tokens_per_step": micro * p.samples * (p.prompt_len + p.completion_len),
        "step_time_s": statistics.median(m["perf/step_time_s"] for m in timed),
        "tokens_per_s": statistics.median(m["perf/tokens_per_s"] for m in timed),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    if old_logprobs:
        result |= {"old_logprobs": old_logprobs, "update_epochs": update_epochs}
    if torch.cuda.is_available():
        result["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    if all("perf/mfu" in m for m in timed):
        result["mfu"] = statistics.median(m["perf/mfu"] for m in timed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), action="append",
                        help="repeatable; default: tiny and 50m on CPU, 0.5b on GPU")
    parser.add_argument("--steps", type=int, default=4, help="trainer steps per preset (the first is warm-up)")
    parser.add_argument("--micro-batches", type=int, default=None, help="micro-batches per step (default: preset's)")
    parser.add_argument("--row-lens", default=None, help="comma-separated row lengths in tokens, e.g. 256,1024,4096")
    parser.add_argument("--old-logprobs", choices=["sampler", "trainer"], default=None,
                        help="run with type grpo and [loss.correction] old_logprobs = this")
    parser.add_argument("--update-epochs", type=int, default=1, help="optimizer steps per batch")
    args = parser.parse_args()
    presets = args.preset or (["0.5b"] if torch.cuda.is_available() else ["tiny", "50m"])
    for name in presets:
        preset = PRESETS[name]
        if not args.row_lens:
            print(json.dumps(run_preset(name, preset, max(args.steps, 2), args.micro_batches, args.old_logprobs,
                                        args.update_epochs)), flush=True)
            continue
        sample_len = preset.prompt_len + preset.completion_len
        step_tokens = max(int(n) for n in args.row_lens.split(","))
        first = None
        for row_len in (int(n) for n in args.row_lens.split(",")):
            per_row = max(1, row_len // sample_len)
            shaped = replace(preset, samples=per_row)
            result = run_preset(name, shaped, max(args.steps, 2), max(1, step_tokens // (per_row * sample_len)))
            first = first or result["step_time_s"] / result["tokens_per_step"]
            result |= {"row_len": per_row * sample_len,
                       "cost_per_token_vs_first": round(result["step_time_s"] / result["tokens_per_step"] / first, 3)}
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

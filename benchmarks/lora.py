"""LoRA against full fine-tuning on the same model: trainer memory and bytes per weight update.

    uv run python benchmarks/lora.py                          # tiny and 50m presets, LoRA rank 8
    uv run python benchmarks/lora.py --preset 50m --rank 16 --steps 3

For each preset of `benchmarks/trainer.py` and each mode (full; lora; lora+norm: LoRA with
`modules_to_save = ["norm"]`, every RMSNorm trained in full) a fresh process runs the real RL
trainer for `--steps` steps on synthetic rollout batches (default threads, checkpoint at the end) and
reports, per mode:

- `train_state_MiB`: parameters + gradients + AdamW state in fp32, counted from the model:
  4 * (all parameters) + 4 * (trainable) + 8 * (trainable) bytes (LoRA: trainable = the adapters and
  the saved norms);
- `peak_rss_MiB`: the process's peak resident memory (`ru_maxrss`: Python, torch and the batches too);
- `update_bytes`: the size of `weights/step_N` (what every weight update moves to the inference server;
  LoRA: the adapter directory, full: the HF directory; tokenizer files included);
- `checkpoint_bytes`: the size of `checkpoints/step_N/trainer` (LoRA: adapters and their optimizer state);
- `step_time_s`: median trainer step after the first.
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

import torch
from transformers import AutoModelForCausalLM

from prime_rl.run_dir import weights_dir
from prime_rl.trainer.config import LoRAConfig, TrainerConfig
from prime_rl.trainer.lora import apply_lora
from prime_rl.trainer.rl.train import train

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer import PRESETS, make_model, random_step, write_random_step  # noqa: E402 (benchmarks/trainer.py)

MIB = 2**20
MODES = ("full", "lora", "lora+norm")


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def state_bytes(model_dir: Path, lora: LoRAConfig | None) -> int:
    """4 bytes per parameter, plus 4 (gradient) + 8 (AdamW moments) per trainable one."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if lora is not None:
        apply_lora(model, lora, seed=0)
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 4 * total + 12 * trainable


def child(preset: str, mode: str, rank: int, steps: int) -> dict:
    """One trainer run in this (fresh) process."""
    p = PRESETS[preset]
    saved = ["norm"] if mode == "lora+norm" else []
    lora = LoRAConfig(rank=rank, alpha=2.0 * rank, modules_to_save=saved) if mode != "full" else None
    with tempfile.TemporaryDirectory(prefix=f"bench-lora-{preset}-") as tmp:
        tmp = Path(tmp)
        make_model(tmp / "model", p)
        out = tmp / "run"
        for step in range(steps):
            write_random_step(out, step, 1, random_step(p.vocab, step, p.micro_batches, p.samples, p.prompt_len,
                                                        p.completion_len))
        train(TrainerConfig.build([], {
            "model": {"name": str(tmp / "model")}, "output_dir": str(out), "max_steps": steps,
            "seq_len": p.samples * (p.prompt_len + p.completion_len), "wandb": {"mode": "disabled"},
            "keep_weights": 1, "lora": None if lora is None else lora.model_dump(),
        }))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return {
            "preset": preset, "mode": mode, "rank": rank if lora else None,
            "train_state_MiB": round(state_bytes(tmp / "model", lora) / MIB, 2),
            "peak_rss_MiB": round(peak / MIB, 1),
            "update_bytes": dir_bytes(weights_dir(out, steps)),
            "checkpoint_bytes": dir_bytes(out / "checkpoints" / f"step_{steps}" / "trainer"),
            "step_time_s": round(statistics.median(m["perf/step_time_s"] for m in lines[1:] or lines), 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), action="append", help="repeatable; default: tiny, 50m")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="trainer steps per run (the first is warm-up)")
    parser.add_argument("--child", nargs=2, metavar=("PRESET", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.rank, args.steps)), flush=True)
        return
    for preset in args.preset or ["tiny", "50m"]:
        for mode in MODES:
            result = subprocess.run([sys.executable, __file__, "--child", preset, mode, "--rank", str(args.rank),
                                     "--steps", str(args.steps)], capture_output=True, text=True, check=True)
            print(result.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()

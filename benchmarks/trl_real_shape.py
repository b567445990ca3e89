"""TRL's GRPO training step at a real vocabulary, for comparison with `benchmarks/real_shape.py`.

Run with an environment that has trl installed (not the repo's), e.g.
    /tmp/trlenv/bin/python benchmarks/trl_real_shape.py --model DIR --row-lens 1024,4096,8192

DIR is the tiny random Qwen3 that `real_shape.py` trains (hidden 64, 2 layers, the real 151,936-row tied embedding
and tokenizer), written from the repo's env with
    uv run python -c "import sys; sys.path.insert(0, '.'); from tests.support.real_tokenizers import save_tiny_model; \
save_tiny_model('qwen3', DIR, max_position_embeddings=20000)"

Each row length runs in a fresh child process under an address-space limit (`--limit-gib`). The child builds a real
`trl.GRPOTrainer` and calls `trainer.train()` for `--steps` optimizer steps of one sequence each (a 128-token prompt
plus the rest as completion). Only generation is replaced: `_generate_and_score_completions` returns a fixed batch of
random token ids shaped as its own output (prompt/completion ids and masks, advantages, num_items_in_batch, and
old_per_token_logps as a vLLM rollout would bring), so everything after it is TRL's: `_prepare_inputs`,
`training_step` -> `_compute_loss` (`_get_per_token_logps_and_entropies` through TRL's fused, chunked LM head, the
default `dapo` loss), backward and the AdamW step. Like our trainer on CPU: float32, no gradient checkpointing
(TRL's defaults, bf16 and gradient checkpointing on, with `--trl-defaults`). Prints one JSON line per row length:
peak RSS (`ru_maxrss`) and the median optimizer-step time after the first, or the child's failure.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

PROMPT = 128
OOM_MARKS = ("MemoryError", "DefaultCPUAllocator", "memory allocation of", "Cannot allocate memory")


def one(model_dir: str, row_len: int, steps: int, trl_defaults: bool) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    vocab = model.config.vocab_size
    completion = row_len - PROMPT

    def generated(self, inputs):  # two completions of one prompt: the GRPO group TRL's config requires (>= 2)
        return {
            "prompt_ids": torch.randint(0, vocab, (2, PROMPT)), "prompt_mask": torch.ones(2, PROMPT, dtype=torch.long),
            "completion_ids": torch.randint(0, vocab, (2, completion)),
            "completion_mask": torch.ones(2, completion, dtype=torch.long),
            "advantages": torch.tensor([1.0, -1.0]), "num_items_in_batch": torch.tensor(2 * completion),
            "old_per_token_logps": torch.full((2, completion), -math.log(vocab)),  # ~ a random model's logprob
        }

    GRPOTrainer._generate_and_score_completions = generated

    class StepTimer(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

    config = GRPOConfig(
        output_dir="/tmp/trl-real-shape", max_steps=steps, per_device_train_batch_size=1, num_generations=2,
        steps_per_generation=2, gradient_accumulation_steps=1, max_completion_length=completion, use_cpu=True,
        report_to="none", save_strategy="no", logging_steps=10**6, disable_tqdm=True,
        **({} if trl_defaults else {"bf16": False, "gradient_checkpointing": False}),
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=config,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * 2 * steps}),
        processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[timer],
    )
    trainer.train()
    return {"row_len": row_len, "trl": trl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "bf16": config.bf16, "gradient_checkpointing": config.gradient_checkpointing, "steps": len(timer.times),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "step_time_s": round(statistics.median(timer.times[1:]), 2),
            "tokens_per_s": round(row_len / statistics.median(timer.times[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the tiny Qwen3 directory (see above)")
    parser.add_argument("--row-lens", default="1024,4096,8192,16384")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per row length (the first is warm-up)")
    parser.add_argument("--limit-gib", type=float, default=20, help="address-space limit of each child")
    parser.add_argument("--trl-defaults", action="store_true", help="keep TRL's bf16 and gradient checkpointing")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one row length
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.model, args.one, max(args.steps, 2), args.trl_defaults)), flush=True)
        return
    limit = int(args.limit_gib * 2**30)
    for row_len in (int(n) for n in args.row_lens.split(",")):
        child = [sys.executable, __file__, "--one", str(row_len), *sys.argv[1:]]
        run = subprocess.run(child, capture_output=True, text=True,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode == 0 and lines:
            print(lines[-1], flush=True)
        else:
            errors = run.stderr.strip().splitlines() or ["(no stderr)"]
            oom = [line for line in errors if any(s in line for s in OOM_MARKS)]  # Python, torch, Rust (tokenizers)
            print(json.dumps({"row_len": row_len, "failed": True, "returncode": run.returncode,
                              "out_of_memory": bool(oom) or run.returncode == -9, "error": (oom or errors)[-1][-300:]}),
                  flush=True)


if __name__ == "__main__":
    main()

"""TRL's GRPO trainer on the reverse-text example, for `benchmarks/versus_trl.py` (which runs ours beside it).

Run with a Python that has trl 1.16 and prime-rl installed (TRL is not a dependency of prime-rl), e.g.
    uv venv /tmp/trlenv --python 3.11
    uv pip install --python /tmp/trlenv/bin/python -e . trl==1.16.0
    /tmp/trlenv/bin/python benchmarks/trl_reverse_text.py --output-dir /tmp/trl-reverse-text

What is the same as `examples/reverse_text/rl.toml`: the model (the embedded `tiny-reverse-text`, float32), the
task (`load_env("reverse-text")`'s examples rendered by the model's chat template, scored by the environment's own
`score`), the batch (64 prompts x 8 completions, one optimizer step per batch: TRL's `num_iterations = 1`), the
sampling (T = 1, no top-p/top-k, at most 16 tokens), the optimizer (AdamW 0.9/0.999, eps 1e-8, no weight decay, lr
5e-4 constant after 5 linear warm-up steps, gradient norm clipped at 1), group advantages (mean and std of each
group of 8), the loss (DAPO's: TRL's default `loss_type`, with the example's eps 0.2 / 0.28; no KL) and the cores
(the caller's; torch's threads = the CPUs this process may use). What is TRL's own: its single process that
generates with `transformers`' `generate`, then trains on the batch (on-policy: no step of lag). Given TRL's best
settings for this model on a CPU: fp32 and no gradient checkpointing (its defaults, bf16 and checkpointing, are
slower here) and the whole batch in one micro-batch.

Writes `metrics.jsonl` in --output-dir, one line per step as the orchestrator writes ours: {"source": "trl",
"step", "time" (when the batch's rewards were computed, as our orchestrator logs a step when its batch is scored),
"reward/mean"}.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import time
from pathlib import Path

PROMPTS_PER_STEP = 64
COMPLETIONS_PER_PROMPT = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from prime_rl.envs import load_env
    from prime_rl.models.embedded import resolve_model_path

    args.output_dir.mkdir(parents=True, exist_ok=True)
    metrics = (args.output_dir / "metrics.jsonl").open("w")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(args.seed)

    env = load_env("reverse-text")
    draws = env.examples(seed=args.seed)
    rows = [next(draws) for _ in range(PROMPTS_PER_STEP * args.max_steps)]
    dataset = Dataset.from_list([{"prompt": e.prompt, "example": i} for i, e in enumerate(rows)])
    steps = itertools.count()

    def reverse_text_reward(completions, example, **kwargs) -> list[float]:
        """The environment's score of each completion (TRL passes the dataset's columns by name)."""
        async def score_all():
            return await asyncio.gather(*(env.score(rows[i], completion[0]["content"])
                                          for i, completion in zip(example, completions, strict=True)))

        rewards = [r.total for r in asyncio.run(score_all())]
        metrics.write(json.dumps({"source": "trl", "step": next(steps), "time": time.time(),
                                  "reward/mean": statistics.fmean(rewards)}) + "\n")
        metrics.flush()
        return rewards

    model_dir = resolve_model_path("tiny-reverse-text")
    batch = PROMPTS_PER_STEP * COMPLETIONS_PER_PROMPT
    config = GRPOConfig(
        output_dir=str(args.output_dir / "trl"), max_steps=args.max_steps, seed=args.seed, use_cpu=True,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=COMPLETIONS_PER_PROMPT, max_completion_length=16, temperature=1.0, top_p=1.0, top_k=0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, learning_rate=5e-4,
        lr_scheduler_type="constant_with_warmup", warmup_steps=5, max_grad_norm=1.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, shuffle_dataset=False,
        bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        processing_class=AutoTokenizer.from_pretrained(model_dir), reward_funcs=reverse_text_reward, args=config,
        train_dataset=dataset,
    )
    trainer.train()
    metrics.close()


if __name__ == "__main__":
    main()

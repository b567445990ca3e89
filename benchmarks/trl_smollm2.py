"""TRL's GRPO trainer on the SmolLM2 example, for `benchmarks/versus_trl_smollm2.py` (which runs ours beside it).

Run with a Python that has trl 1.16, reasoning-gym and prime-rl installed (TRL is not a dependency of prime-rl), and
SmolLM2 already converted (any `uv run eval @ examples/smollm2/rl.toml` does it), e.g.
    uv venv /tmp/trlenv --python 3.11
    uv pip install --python /tmp/trlenv/bin/python -e . trl==1.16.0 reasoning-gym==0.1.25
    /tmp/trlenv/bin/python benchmarks/trl_smollm2.py --output-dir /tmp/trl-smollm2

What is the same as `examples/smollm2/rl.toml` (read from it): the model (SmolLM2-135M-Instruct from the cache,
float32), the task and its prompts (the config's environment, its training examples in the order our orchestrator
draws them, `ExampleSource`), the reward (the environment's own `score`), the held-out set (the first
`eval.num_examples` eval examples, `orchestrator.eval_draws`, greedy, scored the same way), the batch (8 prompts x 8
completions, one optimizer step per batch), the sampling (T = 1, no top-p/top-k, at most `max_tokens` tokens), the
optimizer (AdamW 0.9/0.999, eps 1e-8, no weight decay, the config's lr, constant after its linear warm-up, gradient
norm clipped at 1), group advantages (mean and std of each group of 8) and the cores (the caller's). What is TRL's
own: its loss (`loss_type = "dapo"`, TRL's default, eps 0.2; ours is the config's, AIPO), its single process that
generates with `transformers`' `generate`, then trains on the batch (on-policy). fp32, no gradient checkpointing.

The held-out evaluation (before step 0 and after every --eval-interval optimizer steps) is timed out of TRL's clock:
each `metrics.jsonl` line's "time" is the wall time minus the evaluations so far. Lines: {"source": "trl", "step",
"time", "reward/mean"} per step and {"source": "trl", "step", "time", "eval/<env>/pass@k"} per evaluation.
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

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "smollm2" / "rl.toml")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--eval-interval", type=int, default=5)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from prime_rl.configs.cli import build_config
    from prime_rl.launch.rl_config import RLConfig
    from prime_rl.orchestrator.examples.draws import ExampleSource
    from prime_rl.orchestrator.orchestrator import eval_draws

    config, _ = build_config(RLConfig, ["@", str(args.config), "--wandb.mode", "disabled"])
    o = config.orchestrator
    assert len(o.env) == 1, "one environment"
    name = o.env[0].metric_name
    prompts = o.batch_size // o.rollouts_per_example
    source = ExampleSource(o.env, o.seed)
    draws = source.draw(prompts * args.max_steps)
    held_out = eval_draws(o)
    env = draws[0].environment

    args.output_dir.mkdir(parents=True, exist_ok=True)
    metrics = (args.output_dir / "metrics.jsonl").open("w")
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(o.seed)
    paused = [0.0]  # seconds of evaluation so far: not TRL's training time

    def log(row: dict) -> None:
        metrics.write(json.dumps({"source": "trl", "time": time.time() - paused[0], **row}) + "\n")
        metrics.flush()

    def scores(examples, texts) -> list[float]:
        async def score_all():
            return await asyncio.gather(*(env.score(e, t) for e, t in zip(examples, texts, strict=True)))

        return [r.total for r in asyncio.run(score_all())]

    steps = itertools.count()

    def task_reward(completions, example, **kwargs) -> list[float]:
        rewards = scores([draws[i].example for i in example], [c[0]["content"] for c in completions])
        log({"step": next(steps), "reward/mean": statistics.fmean(rewards)})
        return rewards

    model_dir = config.model.path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def evaluate(step: int) -> None:
        start = time.time()
        tokenizer.padding_side = "left"
        texts = []
        with torch.no_grad():
            for i in range(0, len(held_out), 64):
                chunk = [d.example.prompt for d in held_out[i:i + 64]]
                batch = tokenizer.apply_chat_template(chunk, add_generation_prompt=True, return_tensors="pt",
                                                      padding=True, return_dict=True)
                out = model.generate(**batch, max_new_tokens=o.sampling.max_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
                texts += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        accuracy = statistics.fmean(s >= o.eval.success_threshold for s in scores([d.example for d in held_out],
                                                                                     texts))
        paused[0] += time.time() - start
        log({"step": step, f"eval/{name}/pass@k": accuracy})
        print(f"step {step} eval: {accuracy:.3f} ({time.time() - start:.0f} s, not counted)", flush=True)

    class HeldOut(TrainerCallback):
        def on_step_end(self, _args, state, control, **kwargs):
            if state.global_step % args.eval_interval == 0:
                evaluate(state.global_step)

    dataset = Dataset.from_list([{"prompt": d.example.prompt, "example": i} for i, d in enumerate(draws)])
    optim = config.trainer.optim
    trl_config = GRPOConfig(
        output_dir=str(args.output_dir / "trl"), max_steps=args.max_steps, seed=o.seed, use_cpu=True,
        per_device_train_batch_size=o.batch_size, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=o.rollouts_per_example, max_completion_length=o.sampling.max_tokens,
        temperature=o.sampling.temperature, top_p=1.0, top_k=0, loss_type="dapo", beta=0.0,
        learning_rate=optim.lr, lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.trainer.scheduler.warmup_steps, max_grad_norm=optim.max_norm, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, shuffle_dataset=False, bf16=False,
        gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=task_reward, args=trl_config,
                          train_dataset=dataset, callbacks=[HeldOut()])
    evaluate(0)
    tokenizer.padding_side = "left"
    trainer.train()
    metrics.close()


if __name__ == "__main__":
    main()

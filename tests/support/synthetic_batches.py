"""Random rollout batches in the real file format, for tests and `benchmarks/trainer.py` (a test fixture: not
part of the package).

Each sample is `prompt_len` prompt tokens plus `completion_len` completion tokens drawn
uniformly from the vocabulary; completion tokens train (`loss_mask`), with a random
advantage per sample (also the sample's reward, on its last token, for token-level advantage
types) and inference logprobs near a plausible value (the trainer only needs them to be finite;
the importance ratio then differs from 1, as off-policy data does).
"""

from __future__ import annotations

from pathlib import Path

import torch

from prime_rl.batch_format import MicroBatch, RankBatch, write_step


def random_micro_batch(generator: torch.Generator, vocab_size: int, samples: int, prompt_len: int,
                       completion_len: int, policy_step: int = 0, rewards: bool = False) -> MicroBatch:
    """One packed row of `samples` samples of prompt_len + completion_len tokens each (with `rewards`: the batch's
    `rewards` too, as a token-level advantage type's orchestrator writes them)."""
    length = prompt_len + completion_len
    T = samples * length
    mask_one = torch.cat([torch.zeros(prompt_len, dtype=torch.bool), torch.ones(completion_len, dtype=torch.bool)])
    advantages = torch.randn(samples, generator=generator).repeat_interleave(length)
    loss_mask = mask_one.repeat(samples)
    inference = -torch.rand(T, generator=generator) * 4.0 - 3.0
    last = (torch.arange(T) % length) == length - 1  # each sample's reward (its advantage) on its last token
    return MicroBatch(
        input_ids=torch.randint(0, vocab_size, (T,), generator=generator),
        position_ids=torch.arange(length).repeat(samples),
        sample_lens=torch.full((samples,), length, dtype=torch.long),
        loss_mask=loss_mask,
        inference_logprobs=torch.where(loss_mask, inference, torch.zeros(T)),
        advantages=torch.where(loss_mask, advantages, torch.zeros(T)),
        policy_step=torch.full((samples,), policy_step, dtype=torch.long),
        rewards=torch.where(last, advantages, torch.zeros(T)) if rewards else None,
    )


def random_step(vocab_size: int, step: int, micro_batches: int, samples: int = 2, prompt_len: int = 6,
                completion_len: int = 10, temperature: float = 1.0, seed: int = 0,
                rewards: bool = False) -> list[MicroBatch]:
    """All micro-batches of one step (seeded by `seed` and `step`), before splitting over ranks."""
    generator = torch.Generator().manual_seed(seed * 100_003 + step)
    return [random_micro_batch(generator, vocab_size, samples, prompt_len, completion_len, step, rewards)
            for _ in range(micro_batches)]


def write_random_step(output_dir: Path, step: int, world_size: int, micro_batches: list[MicroBatch],
                      temperature: float = 1.0, max_tokens: int = 16, advantage: str | None = None) -> Path:
    """Deal `micro_batches` round-robin over `world_size` ranks and write `rollouts/step_N/` (`advantage`: the
    orchestrator's advantage type the batch records)."""
    if len(micro_batches) % world_size:
        raise ValueError(f"{len(micro_batches)} micro-batches do not split evenly over {world_size} ranks")
    per_rank = [RankBatch(step, temperature, max_tokens, micro_batches[r::world_size], advantage=advantage)
                for r in range(world_size)]
    return write_step(output_dir, step, per_rank)

"""Rollout batches for the RL trainer: wait for `rollouts/step_N/`, load this rank's file, check it."""

from __future__ import annotations

import math
from pathlib import Path

from prime_rl.batch_format import RankBatch, read_rank
from prime_rl.run_dir import rollout_dir, rollout_file
from prime_rl.utils.errors import PrimeError
from prime_rl.utils.fs import wait_for_path


def check_policy_steps(batch: RankBatch, step: int, max_async_level: int, path: Path) -> None:
    """Every sample that trains must come from weights of step m with max(0, step - max_async_level) <= m <= step.

    m is the sample's `policy_step` (the orchestrator's bound, see orchestrator/weight_sync.py).
    Samples without a trained token (padding rows, masked samples) are not checked: their
    policy step does not enter the update.
    """
    low = max(0, step - max_async_level)
    for mb in batch.micro_batches:
        bad = mb.trained_samples & ((mb.policy_step < low) | (mb.policy_step > step))
        if bad.any():
            policy_step = int(mb.policy_step[bad][0])
            raise PrimeError(
                f"rollout batch {path} of step {step} has a sample with policy_step {policy_step}, outside "
                f"[{low}, {step}] = [max(0, step - max_async_level), step] with max_async_level {max_async_level} "
                "(the trainer's max_async_level must be the orchestrator's)"
            )


def wait_for_batch(output_dir: Path, step: int, rank: int, timeout_s: float,
                   max_async_level: int | None = None) -> tuple[RankBatch, float]:
    """Block until step `step`'s batch exists (at most `timeout_s`); return it and the seconds waited.

    The batch is checked: its step, every micro-batch's shapes, a finite temperature > 0 (the
    logits are divided by it), its truncation's ranges and, when `max_async_level` is given, every trained sample's
    policy step (`check_policy_steps`).
    """
    directory = rollout_dir(output_dir, step)
    what = f"rollout batch of step {step} ({rollout_file(directory, rank).name}, written by the orchestrator)"
    waited = wait_for_path(directory, timeout_s, what)
    path = rollout_file(directory, rank)
    if not path.exists():
        raise PrimeError(f"rollout batch {path} is missing: the orchestrator wrote step {step} for fewer ranks "
                         f"than this trainer has (rank {rank})")
    batch = read_rank(output_dir, step, rank)
    if batch.step != step:
        raise PrimeError(f"rollout batch {path} says step {batch.step}, expected {step}")
    if not (math.isfinite(batch.temperature) and batch.temperature > 0):
        raise PrimeError(f"rollout batch {path} has sampling temperature {batch.temperature}: the trainer divides "
                         "logits by it, so it must be finite and > 0")
    if not (batch.top_k >= -1 and 0 < batch.top_p <= 1 and 0 <= batch.min_p <= 1):
        raise PrimeError(f"rollout batch {path} has an invalid truncation (top_k {batch.top_k}, top_p {batch.top_p}, "
                         f"min_p {batch.min_p}): needs top_k >= -1, 0 < top_p <= 1 and 0 <= min_p <= 1")
    for mb in batch.micro_batches:
        mb.validate()
    if max_async_level is not None:
        check_policy_steps(batch, step, max_async_level, path)
    return batch, waited

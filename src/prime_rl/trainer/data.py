"""Rollout batches for the RL trainer: wait for `rollouts/step_N/`, load this rank's file."""

from __future__ import annotations

from pathlib import Path

from prime_rl.utils.batch_format import RankBatch, rank_file, read_rank, step_dir
from prime_rl.utils.errors import PrimeError
from prime_rl.utils.fs import wait_for_path


def wait_for_batch(output_dir: Path, step: int, rank: int, timeout_s: float) -> tuple[RankBatch, float]:
    """Block until step `step`'s batch exists (at most `timeout_s`); return it and the seconds waited."""
    directory = step_dir(output_dir, step)
    what = f"rollout batch of step {step} ({rank_file(directory, rank).name}, written by the orchestrator)"
    waited = wait_for_path(directory, timeout_s, what)
    path = rank_file(directory, rank)
    if not path.exists():
        raise PrimeError(f"rollout batch {path} is missing: the orchestrator wrote step {step} for fewer ranks "
                         f"than this trainer has (rank {rank})")
    batch = read_rank(output_dir, step, rank)
    if batch.step != step:
        raise PrimeError(f"rollout batch {path} says step {batch.step}, expected {step}")
    for mb in batch.micro_batches:
        mb.validate()
    return batch, waited

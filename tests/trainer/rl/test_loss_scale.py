"""`step_scale`: the loss denominators are counted over every micro-batch of every rank."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from prime_rl.batch_format import RankBatch
from prime_rl.trainer.rl.train import step_scale
from tests.support.synthetic_batches import random_micro_batch
from tests.support.two_ranks import gloo_rank


def rank_batch(rank: int) -> RankBatch:
    g = torch.Generator().manual_seed(rank)
    # rank 0: 2 rows of 3 samples x 4 trained tokens; rank 1: 1 row of 2 samples x 5 trained tokens
    mbs = [random_micro_batch(g, 50, 3, 2, 4) for _ in range(2)] if rank == 0 else [random_micro_batch(g, 50, 2, 3, 5)]
    return RankBatch(step=0, temperature=1.0, max_tokens=16, micro_batches=mbs)


def _worker(rank: int, store_path: str, out) -> None:
    with gloo_rank(rank, store_path):
        scale = step_scale(rank_batch(rank), torch.device("cpu"))
        out.put((rank, scale))


@pytest.mark.slow  # two spawned ranks
def test_scale_is_global_over_ranks(tmp_path):
    # spawn, not fork: the test process may already hold a (one-rank) default process group.
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_worker, args=(str(tmp_path / "store"), out), nprocs=2, start_method="spawn")
    results = dict(out.get(timeout=30) for _ in range(2))
    expected_tokens = 2 * 3 * 4 + 2 * 5
    for rank in (0, 1):
        scale = results[rank]
        assert scale.total_loss_tokens == expected_tokens
        assert scale.num_samples == 3 * 2 + 2
        assert scale.num_micro_batches == 3
        assert scale.max_tokens == 16


def test_single_process_scale_counts_padding_rows_as_no_samples():
    from prime_rl.trainer.dist import init_distributed

    init_distributed()
    batch = rank_batch(0)
    batch.micro_batches[1].loss_mask[:] = False  # a padding row
    scale = step_scale(batch, torch.device("cpu"))
    # A padding row has no trained token: it is neither a sample nor a micro-batch of `token_local`.
    assert (scale.total_loss_tokens, scale.num_samples, scale.num_micro_batches) == (12, 3, 1)

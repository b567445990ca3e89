"""Process group set-up: one code path for one process and for `torchrun --nproc-per-node K`.

Under torchrun (RANK/WORLD_SIZE/LOCAL_RANK set) we join the group torchrun describes:
NCCL when CUDA is available, gloo otherwise. A plain `trainer` / `sft` process creates a
one-process gloo (or NCCL) group backed by an in-memory store, so FSDP2's `fully_shard`,
DTensor gradient clipping and distributed checkpoints run exactly as with K ranks (no
port is opened and nothing is special-cased for world size 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from prime_rl.utils.metric_pairs import combine, is_max_key


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Initialise (once) the default process group and pick this rank's device."""
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, device_id=device if use_cuda else None)
        else:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, device)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few scalars over all ranks (float64, so token counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_pairs(pairs: list[dict[str, torch.Tensor]], device: torch.device,
                     sums: list[float] = ()) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Collective: the metric pairs of this rank's micro-batches (the same keys on every rank) combined over them
    and over every rank (`utils.metric_pairs`: `[sum, count]` summed, a `_max` key's value maxed, a second
    all-reduce only when there is one), and the scalars `sums` summed over ranks."""
    totals: dict[str, torch.Tensor] = {}
    for metrics in pairs:
        for key, pair in metrics.items():
            pair = pair.detach().to("cpu", torch.float64)
            totals[key] = combine(key, totals[key], pair) if key in totals else pair
    keys = sorted(totals)
    flat = [x for k in keys for x in ([0.0, float(totals[k][1])] if is_max_key(k) else totals[k].tolist())]
    reduced = all_reduce_sum([*sums, *flat], device)
    pairs_out = {k: torch.tensor(reduced[len(sums) + 2 * i: len(sums) + 2 * i + 2]) for i, k in enumerate(keys)}
    max_keys = [k for k in keys if is_max_key(k)]
    if max_keys:
        top = torch.tensor([float(totals[k][0]) for k in max_keys], dtype=torch.float64, device=device)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        for k, v in zip(max_keys, top.tolist(), strict=True):
            pairs_out[k][0] = v
    return pairs_out, reduced[:len(sums)]


def all_gather_rows(rows: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """Every rank's `rows` ([N_r, K] float64, N_r may differ between ranks), in rank order, on the CPU."""
    count = torch.tensor([rows.shape[0]], dtype=torch.long, device=device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    longest = max(int(c) for c in counts)
    padded = torch.zeros((longest, rows.shape[1]), dtype=torch.float64, device=device)
    padded[:rows.shape[0]] = rows.to(device=device, dtype=torch.float64)
    gathered = [torch.zeros_like(padded) for _ in counts]
    dist.all_gather(gathered, padded)
    return [g[:int(c)].cpu() for g, c in zip(gathered, counts, strict=True)]


def barrier() -> None:
    dist.barrier()


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

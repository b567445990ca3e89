"""Weights over torch.distributed (`weight_transfer = "distributed"`): the trainer's rank 0 broadcasts each
update to every inference server through a process group of its own, set up at start.

The group is stateless (its own `TCPStore` at `address`, rank 0 the trainer's rank 0, ranks 1..N the
servers; no `init_process_group`, so it lives beside the trainer's FSDP group): gloo on CPU, NCCL on
GPUs. Every collective has the group's timeout. Update k (0, 1, ...) is announced first: rank 0 sets the
store key `update_k` to its step, and the servers wait for that key without a time limit (a trainer step
may take longer than any collective should; waiting on the store holds no collective open, no GPU kernel
spinning; it ends when the trainer's store goes away). Then, within the timeout:

    1. an int64 [1]: the length L of the header
    2. a uint8 [L]: the header, JSON {"step": N, "tensors": [[name, dtype, shape], ...]}
    3. one uint8 buffer per bucket: the raw bytes of consecutive tensors of the header (at most
       `bucket_bytes` a bucket; a bigger tensor alone), in header order

Raw bytes keep every dtype bit for bit (gloo has no bfloat16 reduction, and a broadcast needs none).
Both sides cut the buckets the same way from the header (`buckets`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from prime_rl.run_dir import TRANSFER_MARKER

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
BUCKET_BYTES = 256 * 2**20


ANNOUNCE_WAIT = timedelta(days=3650)  # a server waits this long for the next update's announcement


@dataclass
class TransferGroup:
    """One rank's view of the transfer group: the process group, its store, and the updates sent or received."""

    group: dist.ProcessGroup
    store: dist.TCPStore
    updates: int = 0


def open_group(address: str, rank: int, world_size: int, timeout_s: float, device: torch.device) -> TransferGroup:
    """Join the transfer group at `address` (host:port; rank 0 hosts its store). Blocks until every rank has
    joined, at most `timeout_s`."""
    host, port = address.rsplit(":", 1)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout)
    if device.type == "cuda":  # pragma: no cover - GPU only
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return TransferGroup(dist.ProcessGroupNCCL(store, rank, world_size, options), store)
    return TransferGroup(dist.ProcessGroupGloo(store, rank, world_size, timeout), store)


def _nbytes(spec: list) -> int:
    _, dtype, shape = spec
    return math.prod(shape) * DTYPES[dtype].itemsize


def buckets(specs: list[list], bucket_bytes: int) -> list[list[int]]:
    """Indices of `specs` per bucket: consecutive tensors up to `bucket_bytes` (a bigger one alone)."""
    out, size = [], 0
    for i, spec in enumerate(specs):
        nbytes = _nbytes(spec)
        if not out or (size + nbytes > bucket_bytes and size > 0):
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes
    return out


def _broadcast(group: TransferGroup, tensor: torch.Tensor) -> None:
    group.group.broadcast(tensor, 0).wait()


def send(group: TransferGroup, step: int, tensors: dict[str, torch.Tensor], device: torch.device,
         bucket_bytes: int = BUCKET_BYTES) -> None:
    """Rank 0: announce, then broadcast `tensors` (name -> tensor, float dtypes of `DTYPES`) as weight step `step`."""
    group.store.set(f"update_{group.updates}", str(step))
    group.updates += 1
    names = list(tensors)
    specs = [[name, str(tensors[name].dtype).removeprefix("torch."), list(tensors[name].shape)] for name in names]
    header = json.dumps({"step": step, "tensors": specs}).encode()
    _broadcast(group, torch.tensor([len(header)], dtype=torch.int64, device=device))
    _broadcast(group, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device))
    for bucket in buckets(specs, bucket_bytes):
        raw = torch.cat([tensors[names[i]].detach().contiguous().reshape(-1).view(torch.uint8) for i in bucket])
        _broadcast(group, raw.to(device))


def receive(group: TransferGroup, device: torch.device,
            bucket_bytes: int = BUCKET_BYTES) -> tuple[int, dict[str, torch.Tensor]]:
    """Ranks 1..N: the next update, once announced: (step, name -> tensor on CPU, in the sender's dtypes and
    shapes)."""
    group.store.wait([f"update_{group.updates}"], ANNOUNCE_WAIT)
    group.updates += 1
    length = torch.zeros(1, dtype=torch.int64, device=device)
    _broadcast(group, length)
    header = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    _broadcast(group, header)
    message = json.loads(bytes(header.cpu().tolist()))
    specs = message["tensors"]
    out: dict[str, torch.Tensor] = {}
    for bucket in buckets(specs, bucket_bytes):
        raw = torch.empty(sum(_nbytes(specs[i]) for i in bucket), dtype=torch.uint8, device=device)
        _broadcast(group, raw)
        offset = 0
        for i in bucket:
            name, dtype, shape = specs[i]
            nbytes = _nbytes(specs[i])
            # A copy of its own bytes first: a view across dtypes needs an aligned start.
            out[name] = raw[offset:offset + nbytes].cpu().clone().view(DTYPES[dtype]).reshape(shape)
            offset += nbytes
    return int(message["step"]), out


def write_marker(directory, step: int) -> None:
    """`<directory>/transfer.json`: {"step": N} (the orchestrator asks the servers to serve step N)."""
    (Path(directory) / TRANSFER_MARKER).write_text(json.dumps({"step": step}) + "\n")

"""`checkpoints/step_N/trainer/`: everything needed to continue after N optimizer steps.

Model and optimizer state go through `torch.distributed.checkpoint` (each rank writes its
shards; any world size can load them). The scheduler, the step and each rank's RNG states
are small and saved beside them with `torch.save`. The directory is written under a
temporary name and renamed by rank 0 once every rank has finished, so a checkpoint
directory either is complete or does not exist.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from prime_rl.run_dir import TRAINER, checkpoint_dir, prune_checkpoints


def ckpt_dir(output_dir: Path, step: int) -> Path:
    return checkpoint_dir(output_dir, step, TRAINER)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save_checkpoint(output_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler, extra: dict | None = None, keep: int | None = None) -> Path:
    """Collective: every rank calls it after `step` optimizer steps."""
    rank = dist.get_rank()
    final = ckpt_dir(output_dir, step)
    tmp = final.parent / f".{TRAINER}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({"rng": _rng_state()}, tmp / f"rank_{rank}.pt")
    if rank == 0:
        torch.save({"step": step, "scheduler": scheduler.state_dict(), "extra": extra or {}}, tmp / "meta.pt")
    dist.barrier()
    if rank == 0:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        prune_checkpoints(output_dir, keep)
    dist.barrier()
    return final


def load_checkpoint(output_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler) -> dict:
    """Collective: restore model, optimizer, scheduler and this rank's RNG; returns the saved `extra`."""
    directory = ckpt_dir(output_dir, step)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = torch.load(directory / "meta.pt", weights_only=False)
    scheduler.load_state_dict(meta["scheduler"])
    rank_file = directory / f"rank_{dist.get_rank()}.pt"
    if rank_file.exists():  # absent when resuming on more ranks than saved: fresh RNG there
        _set_rng_state(torch.load(rank_file, weights_only=False)["rng"])
    return meta["extra"]

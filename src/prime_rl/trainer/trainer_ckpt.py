"""`checkpoints/step_N/trainer/`: everything needed to continue after N optimizer steps.

    .metadata, __R_0.distcp   model and optimizer: torch.distributed.checkpoint, each rank writes
                              its shards and any world size can load them
    meta.json                 {"step", "scheduler": its state dict, "extra", "model"} (rank 0)
    rank_R.json               rank R's RNG states: torch, python `random` and CUDA when present
    manifest.json             size and sha256 of every other file (`utils/checksums.py`)

Frozen parameters are not stored: with LoRA the model part holds only the adapters and the saved
modules' weights (and the optimizer their state); the base comes from model.name. With a critic
(advantage type "gae") the DCP part also holds "critic" and "critic_optim". `meta.json`'s "model"
records what was trained (`lora.checkpoint_identity`: LoRA on/off, its shape, the base's
fingerprint; "critic": the critic.type, "separate" or "value_head", with a critic), and a resume into another
one is refused (`lora.check_resume`, and here for the critic's kind) before anything is loaded.

Nothing is pickled besides DCP's own files, and those load with `safe_dcp`'s allow-list:
resuming from a checkpoint someone else supplied cannot run code. State that JSON would
not give back exactly fails at save time, before anything is written (`utils/json_state`).

Save: every rank writes into `step_N/.trainer.tmp`; after a barrier rank 0 hashes all
ranks' files (the directory is shared, as the rename below already requires), writes the
manifest last and renames the directory into place, so a checkpoint directory exists only
complete and with its manifest. Load: rank 0 verifies the manifest before anything else is
read and every rank gets its verdict; any failure (a missing, truncated, changed or extra
file, no manifest, a checkpoint of another model) is one line naming the checkpoint or
file (`UserError`, exit 2) on every rank.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from prime_rl.models.lora_adapter import is_saved_module
from prime_rl.run_dir import TRAINER, TRAINER_META, checkpoint_dir, prune_checkpoints, trainer_rng_file
from prime_rl.trainer import safe_dcp
from prime_rl.trainer.lora import check_resume
from prime_rl.utils.checksums import CorruptCheckpoint, verify_manifest, write_manifest
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import replace_dir
from prime_rl.utils.json_state import (
    dumps_exact,
    python_rng_from_json,
    python_rng_to_json,
    tensor_rng_from_json,
    tensor_rng_to_json,
)

CRITICS = {None: "no critic", "separate": "a separate critic (critic.type 'separate')",
           "value_head": "a value head (critic.type 'value_head')"}


def critic_kind(identity: dict) -> str | None:
    """The critic an identity records: None, "separate" or "value_head" (`true`: a checkpoint written before
    value heads existed, whose critic was a separate model)."""
    kind = identity.get("critic")
    return "separate" if kind is True else (kind or None)

TRAINABLE = StateDictOptions(ignore_frozen_params=True)  # frozen (LoRA base) weights come from model.name


def ckpt_dir(output_dir: Path, step: int) -> Path:
    return checkpoint_dir(output_dir, step, TRAINER)


def _rng_state() -> dict:
    state = {"torch": tensor_rng_to_json(torch.get_rng_state()), "python": python_rng_to_json(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = tensor_rng_to_json(torch.cuda.get_rng_state())
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(tensor_rng_from_json(state["torch"]))
    random.setstate(python_rng_from_json(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensor_rng_from_json(state["cuda"]))


def _trained_state(model: nn.Module, optimizer: torch.optim.Optimizer, identity: dict | None) -> tuple[dict, dict]:
    """Model and optimizer state dicts of the trained parameters: all of them, or with LoRA the adapters and
    the saved modules' weights (a tied frozen weight such as lm_head slips through `ignore_frozen_params`,
    hence the name filter)."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINABLE)
    lora = (identity or {}).get("lora")
    if lora is not None:
        saved = lora.get("modules_to_save", [])
        model_sd = {key: value for key, value in model_sd.items()
                    if ".lora_" in key or is_saved_module(key.rpartition(".")[0], saved)}
    return model_sd, optim_sd


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, identity: dict | None, critic) -> dict:
    """What a checkpoint's DCP part holds: the trained state of the policy, and of the critic if any."""
    model_sd, optim_sd = _trained_state(model, optimizer, identity)
    state = {"model": model_sd, "optim": optim_sd}
    if critic is not None:
        state["critic"], state["critic_optim"] = get_state_dict(critic.model, critic.optimizer, options=TRAINABLE)
    return state


def save_checkpoint(output_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler, extra: dict | None = None, keep: int | None = None,
                    identity: dict | None = None, critic=None) -> Path:
    """Collective: every rank calls it after `step` optimizer steps. `identity`: what was trained
    (`lora.checkpoint_identity`, with "critic": its type), checked on resume; `critic`: the `gae` critic, a
    separate model (`trainer/critic.py`) or a value head (`trainer/value_head.py`), its `model` and `optimizer`
    stored beside the policy as "critic" and "critic_optim"."""
    rank = dist.get_rank()
    # Every rank serialises first: a field JSON cannot restore fails on all ranks, before any write.
    meta = dumps_exact({"step": step, "scheduler": scheduler.state_dict(), "extra": extra or {},
                        "model": identity or {"lora": None}}, "checkpoint meta")
    rng = dumps_exact(_rng_state(), "RNG state")
    final = ckpt_dir(output_dir, step)
    tmp = final.parent / f".{TRAINER}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save(_state(model, optimizer, identity, critic), checkpoint_id=str(tmp))
    trainer_rng_file(tmp, rank).write_text(rng)
    if rank == 0:
        (tmp / TRAINER_META).write_text(meta)
    dist.barrier()
    if rank == 0:
        write_manifest(tmp)
        replace_dir(tmp, final)
        prune_checkpoints(output_dir, keep)
    dist.barrier()
    return final


def _verify(directory: Path) -> None:
    """Collective: rank 0 checks the manifest; every rank raises its `CorruptCheckpoint` if any."""
    verdict = [None]
    if dist.get_rank() == 0:
        try:
            verify_manifest(directory)
        except CorruptCheckpoint as exc:
            verdict = [str(exc)]
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise CorruptCheckpoint(verdict[0])


def load_checkpoint(output_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler, identity: dict | None = None, critic=None) -> dict:
    """Collective: verify, check the checkpoint trained this `identity` (its LoRA shape and its kind of critic,
    which `critic` is), then restore model, optimizer, the critic, scheduler and this rank's RNG; returns the saved
    `extra`."""
    directory = ckpt_dir(output_dir, step)
    _verify(directory)
    try:
        meta = json.loads((directory / TRAINER_META).read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load checkpoint {directory}: {TRAINER_META}: {exc}") from None
    saved = meta.get("model") or {"lora": None}
    check_resume(saved, identity or {"lora": None}, str(directory))
    was, now = critic_kind(saved), critic_kind(identity or {})
    if was != now:
        raise UserError(f"checkpoint {directory} was trained with {CRITICS.get(was, repr(was))} but this run has "
                        f"{CRITICS.get(now, repr(now))} (advantage type 'gae' trains a critic of critic.type): resume "
                        "with the checkpoint's advantage type and critic.type")
    try:
        state = _state(model, optimizer, identity, critic)
        safe_dcp.load(state, directory)
        # strict=False: the frozen weights are absent by design; DCP's load above already failed on any
        # trained key the checkpoint lacks.
        options = StateDictOptions(ignore_frozen_params=True, strict=False)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=options)
        if critic is not None:
            set_state_dict(critic.model, critic.optimizer, model_state_dict=state["critic"],
                           optim_state_dict=state["critic_optim"], options=options)
        if meta["step"] != step:
            raise ValueError(f"{TRAINER_META} is of step {meta['step']}")
        scheduler.load_state_dict(meta["scheduler"])
        own = trainer_rng_file(directory, dist.get_rank())
        if own.exists():  # absent when resuming on more ranks than saved: fresh RNG there
            _set_rng_state(json.loads(own.read_text()))
        return meta["extra"]
    except safe_dcp.LOAD_FAILURES as exc:
        raise UserError(f"cannot load checkpoint {directory}: {safe_dcp.one_line_reason(exc)}") from None

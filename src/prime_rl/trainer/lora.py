"""LoRA in the trainer (through peft): inject adapters, gather them, merge them.

A targeted linear layer computes `y = x W0^T + s * dropout(x) A^T B^T` with `s = alpha / r`,
A [r, in] (kaiming-uniform init, seeded) and B [out, r] (zeros), so step 0 is the base model.
Only A and B are trainable, and the weights of the modules `modules_to_save` names (trained in
full, in place: e.g. every RMSNorm's gain g in g * x / rms(x)); the other base weights are frozen.

The network the trainer shards stays the Hugging Face model (`peft_model.base_model.model`,
with peft's `lora.Linear` layers injected in place), so `decoder_layers`, `prepare_model` and
FSDP2 work unchanged. Its parameters are named `...q_proj.base_layer.weight` and
`...q_proj.lora_{A,B}.default.weight`; an adapter directory names them as peft saves them,
`base_model.model....q_proj.lora_{A,B}.weight` (`prime_rl.models.lora_adapter`), and a saved module's
`model.norm.weight` as `base_model.model.model.norm.weight`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from prime_rl.models.lora_adapter import ADAPTER, ADAPTER_WEIGHTS, is_saved_module, lora_delta, lora_scale, peft_key
from prime_rl.trainer.config import LoRAConfig
from prime_rl.utils.errors import UserError

BASE = ".base_layer.weight"


def apply_lora(net: nn.Module, config: LoRAConfig, seed: int):
    """Inject LoRA adapters into `net` in place (seeded: every rank and every run get the same A);
    returns the `PeftModel` (its `base_model.model` is `net`). A target that matches no linear layer
    of the decoder layers is a UserError; so is a `modules_to_save` entry that matches no module
    (`train_saved_modules`)."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear

    peft_config = LoraConfig(r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                             target_modules=list(config.target_modules), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            peft_model = get_peft_model(net, peft_config)
        except ValueError as exc:
            raise UserError(f"lora.target_modules {list(config.target_modules)}: {str(exc).splitlines()[0]}") from None
    lora_layers = {name: module for name, module in net.named_modules() if hasattr(module, "lora_A")}
    for name, module in lora_layers.items():
        if not isinstance(module, LoraLinear) or ".layers." not in f".{name}":
            raise UserError(f"lora.target_modules: {name} is not a linear layer of a decoder layer "
                            "(only those can be adapted)")
    for target in config.target_modules:
        if not any(name == target or name.endswith(f".{target}") for name in lora_layers):
            raise UserError(f"lora.target_modules: {target!r} matches no linear layer of the model")
    train_saved_modules(net, config.modules_to_save)
    return peft_model


def train_saved_modules(net: nn.Module, modules_to_save: list[str]) -> list[str]:
    """Make the weights of every module `modules_to_save` names trainable, in place (peft would wrap each
    in a copy; in place the names stay those FSDP2 and the merged weights use). Returns the modules' names.

    Each entry must match (peft's suffix rule, `models.lora_adapter.is_saved_module`) at least one module, and every
    match must be a leaf module with weights of its own, outside the LoRA layers and tied to no other module
    (a tied embedding would change lm_head too, which the adapter could not ship): else a UserError."""
    shared = {}
    for name, param in net.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    matched: dict[str, nn.Module] = {}
    for entry in modules_to_save:
        found = {name: module for name, module in net.named_modules()
                 if name and is_saved_module(name, [entry])}
        if not found:
            raise UserError(f"lora.modules_to_save: {entry!r} matches no module of the model")
        for name, module in found.items():
            params = list(module.named_parameters(recurse=False))
            if ".lora_" in name or ".base_layer" in name or hasattr(module, "lora_A"):
                raise UserError(f"lora.modules_to_save: {entry!r} matches {name}, which is part of a LoRA layer "
                                "(a layer is adapted or saved, not both)")
            if any(True for _ in module.children()) or not params:
                raise UserError(f"lora.modules_to_save: {entry!r} matches {name}, which is not a layer with weights "
                                "of its own (name layers, e.g. 'norm')")
            for pname, param in params:
                if len(shared[id(param)]) > 1:
                    raise UserError(f"lora.modules_to_save: {name}.{pname} is tied to "
                                    f"{[n for n in shared[id(param)] if n != f'{name}.{pname}'][0]}: tied weights "
                                    "cannot be saved with an adapter")
            matched[name] = module
    for module in matched.values():
        module.requires_grad_(True)
    return sorted(matched)


@dataclass(frozen=True)
class LoRAWeights:
    """What `weights.write_weights` needs to publish a LoRA model: peft's config of the adapter, its
    scale, and whether to publish merged full weights instead."""

    peft_config: Any  # peft.LoraConfig
    scale: float
    merge: bool

    @classmethod
    def of(cls, peft_model, config: LoRAConfig) -> LoRAWeights:
        """The saved config names `modules_to_save`, so that peft loads the saved modules' weights too."""
        peft_config = copy.deepcopy(peft_model.peft_config[ADAPTER])
        peft_config.modules_to_save = list(config.modules_to_save) or None
        return cls(peft_config, lora_scale(config.rank, config.alpha), config.merge)

    def save_adapter(self, directory: Path, tensors: dict[str, torch.Tensor]) -> None:
        """adapter_config.json and adapter_model.safetensors, as `PeftModel.save_pretrained` writes them."""
        from safetensors.torch import save_file

        peft_config = copy.deepcopy(self.peft_config)
        peft_config.inference_mode = True
        peft_config.save_pretrained(str(directory))
        save_file({k: t.contiguous() for k, t in tensors.items()}, str(Path(directory) / ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().cpu()


def gather_adapter(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full A and B of every adapter and the saved modules' weights (on CPU), in peft's
    saved names."""
    return {peft_key(name): _full(p) for name, p in model.named_parameters() if p.requires_grad}


def merged_state(full_state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A full state dict of the injected model turned into the plain model's: every adapted layer's
    `base_layer.weight` becomes `weight` = W0 + scale * B @ A, the adapters dropped."""
    out = {}
    for name, tensor in full_state.items():
        if ".lora_" in name:
            continue
        if name.endswith(BASE):
            prefix = name[: -len(BASE)]
            a = full_state[f"{prefix}.lora_A.{ADAPTER}.weight"]
            b = full_state[f"{prefix}.lora_B.{ADAPTER}.weight"]
            name, tensor = f"{prefix}.weight", tensor + lora_delta(a, b, scale).to(tensor.dtype)
        out[name] = tensor
    return out


def base_fingerprint(model: nn.Module, device: torch.device) -> list[float]:
    """Collective: [sum, sum of squares] of every frozen parameter (float64, summed over ranks): tells
    a resume that the base weights are those the checkpoint's adapters were trained on."""
    import torch.distributed as dist

    total = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            if not p.requires_grad:
                local = (p.to_local() if isinstance(p, DTensor) else p).detach().double()
                total += torch.stack([local.sum(), local.square().sum()]).cpu()
    total = total.to(device)
    dist.all_reduce(total)
    return total.cpu().tolist()


# The LoRA fields a checkpoint records and a resume must keep, with the value a checkpoint written before
# the field existed stands for.
IDENTITY = {"rank": None, "alpha": None, "target_modules": None, "modules_to_save": [], "merge": False}


def checkpoint_identity(config: LoRAConfig | None, fingerprint: list[float] | None) -> dict:
    """What a checkpoint records of the model it trained (meta.json "model"): the LoRA shape, the base's
    fingerprint, and `merge` (`dropout` is left out: it may change between a run and its resume). `merge` may
    not change: a resumed server loads the newest weights/step_N, which with merge = true already hold the
    adapter merged in, and would add the next adapter on top of that (W0 + delta + delta')."""
    if config is None:
        return {"lora": None}
    return {"lora": config.model_dump(include=set(IDENTITY)), "base": fingerprint}


def check_resume(saved: dict, current: dict, where: str) -> None:
    """UserError (one line) when checkpoint `where` was trained on another model than this run's:
    LoRA on/off, another rank, alpha, targets, saved modules or merge, or other base weights (fingerprints
    within 1e-9)."""
    was, now = saved.get("lora"), current.get("lora")
    if was is None and now is not None:
        raise UserError(f"checkpoint {where} was trained without LoRA (full fine-tuning) but this run sets lora: "
                        "resume without [lora], or start a new run")
    if was is not None and now is None:
        raise UserError(f"checkpoint {where} holds LoRA adapters (rank {was['rank']}) but this run has no [lora]: "
                        "resume with the same [lora] section")
    if was is None:
        return
    for key, default in IDENTITY.items():
        if was.get(key, default) != now.get(key, default):
            raise UserError(f"checkpoint {where} was trained with lora.{key} = {was.get(key, default)!r}, this run "
                            f"has {now.get(key, default)!r}: resume with the checkpoint's value")
    old, new = saved.get("base"), current.get("base")
    if old is not None and new is not None and any(
            abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0) for a, b in zip(old, new, strict=True)):
        raise UserError(f"checkpoint {where} holds LoRA adapters of other base weights than model.name's "
                        "(their fingerprints differ): resume with the model the run started from")

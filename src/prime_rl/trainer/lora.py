"""LoRA in the trainer (through peft): inject adapters, gather them, merge them.

A targeted linear layer computes `y = x W0^T + s * dropout(x) A^T B^T` with `s = alpha / r`,
A [r, in] (kaiming-uniform init, seeded) and B [out, r] (zeros), so step 0 is the base model.
Only A and B are trainable; the base weights are frozen.

The network the trainer shards stays the Hugging Face model (`peft_model.base_model.model`,
with peft's `lora.Linear` layers injected in place), so `decoder_layers`, `prepare_model` and
FSDP2 work unchanged. Its parameters are named `...q_proj.base_layer.weight` and
`...q_proj.lora_{A,B}.default.weight`; an adapter directory names them as peft saves them,
`base_model.model....q_proj.lora_{A,B}.weight` (`prime_rl.utils.lora`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor

from prime_rl.trainer.config import LoRAConfig
from prime_rl.utils.errors import UserError
from prime_rl.utils.lora import ADAPTER, ADAPTER_WEIGHTS, lora_delta, lora_scale, peft_key

BASE = ".base_layer.weight"


def apply_lora(net: nn.Module, config: LoRAConfig, seed: int):
    """Inject LoRA adapters into `net` in place (seeded: every rank and every run get the same A);
    returns the `PeftModel` (its `base_model.model` is `net`). A target that matches no linear layer
    of the decoder layers is a UserError."""
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
    return peft_model


@dataclass(frozen=True)
class LoRAWeights:
    """What `weights.write_weights` needs to publish a LoRA model: peft's config of the adapter, its
    scale, and whether to publish merged full weights instead."""

    peft_config: Any  # peft.LoraConfig
    scale: float
    merge: bool

    @classmethod
    def of(cls, peft_model, config: LoRAConfig) -> LoRAWeights:
        return cls(peft_model.peft_config[ADAPTER], lora_scale(config.rank, config.alpha), config.merge)

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
    """Collective: the full A and B of every adapter (on CPU), in peft's saved names."""
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


def checkpoint_identity(config: LoRAConfig | None, fingerprint: list[float] | None) -> dict:
    """What a checkpoint records of the model it trained (meta.json "model"): the LoRA shape, the base's
    fingerprint, and `merge` (`dropout` is left out: it may change between a run and its resume). `merge` may
    not change: a resumed server loads the newest weights/step_N, which with merge = true already hold the
    adapter merged in, and would add the next adapter on top of that (W0 + delta + delta')."""
    if config is None:
        return {"lora": None}
    return {"lora": config.model_dump(include={"rank", "alpha", "target_modules", "merge"}), "base": fingerprint}


def check_resume(saved: dict, current: dict, where: str) -> None:
    """UserError (one line) when checkpoint `where` was trained on another model than this run's:
    LoRA on/off, another rank, alpha, targets or merge, or other base weights (fingerprints within 1e-9)."""
    was, now = saved.get("lora"), current.get("lora")
    if was is None and now is not None:
        raise UserError(f"checkpoint {where} was trained without LoRA (full fine-tuning) but this run sets lora: "
                        "resume without [lora], or start a new run")
    if was is not None and now is None:
        raise UserError(f"checkpoint {where} holds LoRA adapters (rank {was['rank']}) but this run has no [lora]: "
                        "resume with the same [lora] section")
    if was is None:
        return
    for key in ("rank", "alpha", "target_modules", "merge"):
        if was[key] != now[key]:
            raise UserError(f"checkpoint {where} was trained with lora.{key} = {was[key]!r}, this run has "
                            f"{now[key]!r}: resume with the checkpoint's value")
    old, new = saved.get("base"), current.get("base")
    if old is not None and new is not None and any(
            abs(a - b) > 1e-9 * max(abs(a), abs(b), 1.0) for a, b in zip(old, new, strict=True)):
        raise UserError(f"checkpoint {where} holds LoRA adapters of other base weights than model.name's "
                        "(their fingerprints differ): resume with the model the run started from")

"""The LoRA adapter directory as peft saves it, shared by the trainer (writes it) and the inference
server (checks and applies it).

    weights/step_N/adapter_config.json         peft's LoraConfig: r, lora_alpha, target_modules, ...
    weights/step_N/adapter_model.safetensors   base_model.model.<module>.lora_A.weight  [r, in]
                                               base_model.model.<module>.lora_B.weight  [out, r]

                                               base_model.model.<saved>.weight  (modules_to_save)

where `<module>` is the Hugging Face name of a linear layer (e.g. `model.layers.0.self_attn.q_proj`,
whose weight is `<module>.weight` [out, in]). The adapted weight is

    W = W0 + (lora_alpha / r) * B @ A          (use_rslora: lora_alpha / sqrt(r))

`<saved>` is a module named by the config's `modules_to_save` (e.g. `model.norm`, an RMSNorm): its
trained weights are stored in full and replace the base's, as `PeftModel.from_pretrained` loads them.
"""

from __future__ import annotations

import math

import torch

ADAPTER = "default"  # peft's adapter name inside the trainer's model
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


def peft_key(name: str) -> str:
    """The trainer's parameter name `<module>.lora_A.default.weight` as peft saves it:
    `base_model.model.<module>.lora_A.weight`."""
    return PREFIX + name.replace(f".{ADAPTER}.", ".")


def is_saved_module(module: str, modules_to_save: list[str] | tuple[str, ...]) -> bool:
    """Does `modules_to_save` name `module`? peft's rule: the module's name ends with an entry (so "norm" is
    `model.norm` and every `...input_layernorm`, `...q_norm`)."""
    return any(module.endswith(entry) for entry in modules_to_save)


def split_key(key: str) -> tuple[str, str] | None:
    """`base_model.model.<module>.lora_{A,B}.weight` -> (`<module>`, "A" or "B"); None for any other name."""
    for part in ("A", "B"):
        suffix = f".lora_{part}.weight"
        if key.startswith(PREFIX) and key.endswith(suffix) and len(key) > len(PREFIX) + len(suffix):
            return key[len(PREFIX): -len(suffix)], part
    return None


def lora_scale(rank: int, alpha: float, rslora: bool = False) -> float:
    """alpha / r (rsLoRA: alpha / sqrt(r))."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def lora_delta(a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * B @ A, computed in float32 (at least): the [out, in] change of the adapted weight."""
    dtype = torch.promote_types(a.dtype, torch.float32)
    return (b.to(dtype) @ a.to(dtype)) * scale

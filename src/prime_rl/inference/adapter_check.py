"""Does a LoRA adapter directory fit the served model? Checked before an update changes anything.

An adapter directory (`prime_rl.models.lora_adapter`: `adapter_config.json` + `adapter_model.safetensors`,
as peft saves it) is refused (UserError, HTTP 400) unless

- `adapter_config.json` is a JSON object of a plain LoRA: `peft_type` "LORA", an integer `r` >= 1,
  a finite `lora_alpha`, `bias` "none", `modules_to_save` absent or a list of names, and none of the
  options this server does not apply (`UNSUPPORTED`: DoRA, per-layer rank/alpha patterns, ...);
- every tensor of `adapter_model.safetensors` is `base_model.model.<module>.lora_{A,B}.weight`
  for a `<module>` whose `<module>.weight` is a 2-d, untied weight [out, in] of the served model,
  each module has both, A is [r, in] and B is [out, r], in a float dtype a trainer writes; or
  `base_model.model.<name>` for an untied weight `<name>` of the served model whose module
  `modules_to_save` names (`models.lora_adapter.is_saved_module`), of that weight's shape, in such a dtype;
- every value is finite (each tensor is read once);
- both files are regular files, read through the descriptors they were checked on (an update's
  `weights.WeightDir`: opened once and checked against the allowed roots by `weights.open_update_dir`).

The adapter then changes each module's weight to W0 + scale * B @ A (`models.lora_adapter`), with
scale = lora_alpha / r (lora_alpha / sqrt(r) with `use_rslora`), and sets each saved weight.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from prime_rl.inference.weight_check import (
    TRAINER_FLOATS,
    Reference,
    TensorSpec,
    check_finite,
    read_file_specs,
    read_json_object,
)
from prime_rl.inference.weight_dirs import WeightDir, opened
from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX, is_saved_module, lora_scale, split_key
from prime_rl.utils.errors import UserError

UNSUPPORTED = ("use_dora", "rank_pattern", "alpha_pattern", "layer_replication", "lora_bias",
               "trainable_token_indices", "target_parameters", "fan_in_fan_out", "alora_invocation_tokens",
               "use_qalora")


@dataclass
class Adapter:
    """A checked adapter: its rank, scale, `modules_to_save`, and (A, B) per module and the value per saved
    weight name (both empty unless read with `keep`)."""

    rank: int
    scale: float
    modules_to_save: list[str]
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]
    saved: dict[str, torch.Tensor]


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)`, cut to `limit` characters: a hostile config's value must not fill an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_adapter_config(source: WeightDir | str | Path) -> tuple[int, float, list[str]]:
    """(r, scale, modules_to_save) of a plain LoRA `adapter_config.json`; UserError naming the first problem."""
    with opened(source) as weights:
        file = weights.path / ADAPTER_CONFIG
        config = read_json_object(weights.file(ADAPTER_CONFIG))
    if config.get("peft_type") != "LORA":
        raise UserError(f"{file}: peft_type {shown(config.get('peft_type'))} is not a LoRA adapter (peft_type 'LORA')")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise UserError(f"{file}: r must be an integer >= 1 (got {shown(rank)})")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise UserError(f"{file}: lora_alpha must be a finite number (got {shown(alpha)})")
    if config.get("bias", "none") != "none":
        raise UserError(f"{file}: bias = {shown(config['bias'])} is not supported (only 'none')")
    for key in UNSUPPORTED:
        if config.get(key):
            raise UserError(f"{file}: {key} = {shown(config[key])} is not supported by weight updates "
                            "(plain LoRA only)")
    rslora = config.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise UserError(f"{file}: use_rslora must be true or false")
    saved = config.get("modules_to_save") or []
    if not isinstance(saved, list) or not all(isinstance(name, str) and name for name in saved):
        raise UserError(f"{file}: modules_to_save must be a list of module names (got {shown(saved)})")
    return rank, lora_scale(rank, alpha, rslora), saved


def saved_name(key: str, modules_to_save: list[str]) -> str | None:
    """`base_model.model.<name>` -> `<name>` when `modules_to_save` names `<name>`'s module; else None."""
    name = key[len(PREFIX):] if key.startswith(PREFIX) else ""
    return name if "." in name and is_saved_module(name.rpartition(".")[0], modules_to_save) else None


def check_adapter_specs(path: str | Path, found: dict[str, TensorSpec], rank: int, modules_to_save: list[str],
                        reference: Reference | None) -> None:
    """Names, shapes and dtypes of an adapter's tensors (module docstring); against the served model when
    there is a `reference`, else only among themselves (A [r, n], B [m, r])."""
    tied = set().union(*reference.tied) if reference is not None and reference.tied else set()
    parts: dict[str, dict[str, TensorSpec]] = {}
    saved: dict[str, TensorSpec] = {}
    for key, spec in found.items():
        split = split_key(key)
        name = saved_name(key, modules_to_save) if split is None else None
        if name is not None:
            saved[name] = spec
            continue
        if split is None:
            raise UserError(f"adapter in {path}: unexpected tensor {key} (expected base_model.model.<module>"
                            ".lora_A.weight / .lora_B.weight, or a weight of a module modules_to_save names)")
        parts.setdefault(split[0], {})[split[1]] = spec
    if not parts:
        raise UserError(f"adapter in {path} holds no LoRA tensors")
    for module, pair in sorted(parts.items()):
        missing = {"A", "B"} - pair.keys()
        if missing:
            raise UserError(f"adapter in {path}: {module} has no lora_{missing.pop()}.weight")
        shape_a, shape_b = pair["A"].shape, pair["B"].shape
        out_features, in_features = (shape_b[0] if len(shape_b) == 2 else -1), (shape_a[-1] if shape_a else -1)
        if reference is not None:
            weight = reference.specs.get(f"{module}.weight")
            if weight is None or len(weight.shape) != 2 or f"{module}.weight" in tied:
                raise UserError(f"adapter in {path} targets {module}, which is not an untied linear layer of the "
                                "served model")
            out_features, in_features = weight.shape
        for part, want in (("A", (rank, in_features)), ("B", (out_features, rank))):
            spec = pair[part]
            if spec.shape != want:
                raise UserError(f"adapter in {path}: {module}.lora_{part}.weight has shape {list(spec.shape)}, "
                                f"expected {list(want)} (r = {rank}, the adapted weight [out, in] = "
                                f"{[out_features, in_features]})")
            check_dtype(path, f"{module}.lora_{part}.weight", spec)
    for name, spec in sorted(saved.items()):
        if f"{name.rpartition('.')[0]}" in parts:
            raise UserError(f"adapter in {path}: {name} is both adapted (lora_A/lora_B) and saved in full")
        if reference is not None:
            want = reference.specs.get(name)
            if want is None or name in tied:
                raise UserError(f"adapter in {path} saves {name}, which is not an untied weight of the served model")
            if spec.shape != want.shape:
                raise UserError(f"adapter in {path}: saved {name} has shape {list(spec.shape)}, the served model's "
                                f"is {list(want.shape)}")
        check_dtype(path, name, spec)


def check_dtype(path: str | Path, name: str, spec: TensorSpec) -> None:
    if spec.dtype not in TRAINER_FLOATS:
        raise UserError(f"adapter in {path}: {name} has dtype {spec.dtype} "
                        f"(expected one of {', '.join(sorted(TRAINER_FLOATS))})")


def verify_adapter_dir(source: WeightDir | str | Path, reference: Reference | None, keep: bool) -> Adapter:
    """Run every check on an adapter directory (an update's open `WeightDir`, or a trusted path); with `keep`,
    return its tensors too.

    Without a reference (a vLLM model whose checkpoint cannot be read) the shapes are checked only among
    themselves."""
    tensors: dict[str, torch.Tensor] = {}
    with opened(source) as weights:
        path = weights.path
        rank, scale, modules_to_save = read_adapter_config(weights)
        file = weights.file(ADAPTER_WEIGHTS)
        check_adapter_specs(path, read_file_specs(file), rank, modules_to_save, reference)
        try:
            for key, tensor in file.tensors():
                check_finite(path, key, tensor)
                if keep:
                    tensors[key] = tensor
        except UserError:
            raise
        except Exception as exc:  # safetensors raises its own error types for corrupt files
            raise UserError(f"cannot read the adapter in {path}: {exc}") from None
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    saved: dict[str, torch.Tensor] = {}
    for key in tensors:
        module, part = split_key(key) or ("", "")
        if part == "A":
            modules[module] = (tensors[key], tensors[key.replace(".lora_A.", ".lora_B.")])
        elif not part:
            saved[key[len(PREFIX):]] = tensors[key]
    return Adapter(rank, scale, modules_to_save, modules, saved)

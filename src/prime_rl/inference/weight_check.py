"""Does a weight directory fit the served model? Checked before any update swaps weights.

An update only ever reads tensors (`*.safetensors`) into the model the server started
with: no code, no new architecture. It is refused (UserError, HTTP 400) unless

- its `config.json` agrees with the served model's on every architecture key both have
  (`ARCH_KEYS`: model type, sizes, layer and head counts, tied embeddings, ...);
- its tensors are exactly the served model's: no name missing, none unexpected, every
  shape equal, every dtype the served one or, for a floating parameter, another float
  a trainer writes (float32, bfloat16, float16; it is cast on load). Names that share one
  tensor (tied embeddings: `lm_head.weight` is `model.embed_tokens.weight`) form a group
  of which at least one must be present, as `save_pretrained` writes only one;
- every floating value is finite (a NaN would make every later request fail);
- every file read is a regular file, read through the descriptor it was checked on (`weights.WeightFile`: a
  FIFO would block the reader; a rename after the check must not redirect the read).

Every reader takes a `weights.WeightDir` (an update's files, opened and checked once) or a path
(a trusted local directory: the served model's, opened here following its links).

The reference is the served model itself (builtin: its state dict and config) or the
directory it was loaded from (vLLM, whose parameters are fused and renamed internally).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from prime_rl.inference.weight_dirs import CONFIG, WeightDir, WeightFile, opened
from prime_rl.utils.errors import UserError

ARCH_KEYS = ("model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "tie_word_embeddings",
             "num_experts", "num_experts_per_tok", "moe_intermediate_size")
TRAINER_FLOATS = frozenset({"F32", "BF16", "F16"})
FLOATS = TRAINER_FLOATS | {"F64", "F8_E4M3", "F8_E5M2"}
TORCH_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}
TIED_PAIR = frozenset({"model.embed_tokens.weight", "lm_head.weight"})
SHOWN = 3  # names listed in a message


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str  # safetensors' name: F32, BF16, I64, ...


@dataclass
class Reference:
    """What an update must match: architecture config, tensor specs, groups of tied names."""

    config: dict
    specs: dict[str, TensorSpec]
    tied: list[frozenset[str]] = field(default_factory=list)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> Reference:
        """The live model: its state dict (tied names found by shared storage) and config."""
        state = model.state_dict()
        specs = {name: TensorSpec(tuple(t.shape), TORCH_DTYPES.get(t.dtype, str(t.dtype))) for name, t in state.items()}
        by_storage: dict[tuple, set[str]] = {}
        for name, tensor in state.items():
            if tensor.numel():  # empty tensors all share data_ptr 0
                by_storage.setdefault((tensor.data_ptr(), tuple(tensor.shape)), set()).add(name)
        tied = [frozenset(names) for names in by_storage.values() if len(names) > 1]
        return cls(model.config.to_dict(), specs, tied)

    @classmethod
    def from_dir(cls, path: str | Path) -> Reference:
        """A checkpoint directory (the one the server started from): its config.json and tensor headers."""
        with opened(path) as weights:
            config = read_config(weights)
            specs = read_specs(weights)
        tied = []
        present = TIED_PAIR & specs.keys()
        if config.get("tie_word_embeddings") and present:
            spec = specs[next(iter(sorted(present)))]
            specs.update({name: spec for name in TIED_PAIR})
            tied.append(TIED_PAIR)
        return cls(config, specs, tied)


def read_json_object(file: WeightFile) -> dict:
    """A JSON object file (config.json, adapter_config.json), read through its descriptor; UserError otherwise."""
    try:
        value = json.loads(file.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {file.path}: {exc}") from None
    if not isinstance(value, dict):
        raise UserError(f"{file.path} is not a JSON object")
    return value


def read_config(source: WeightDir | str | Path) -> dict:
    with opened(source) as weights:
        return read_json_object(weights.file(CONFIG))


def read_file_specs(file: WeightFile) -> dict[str, TensorSpec]:
    """Name -> shape and dtype of every tensor in one safetensors file's header (no data read)."""
    try:
        return {name: TensorSpec(shape, dtype) for name, (shape, dtype) in file.specs().items()}
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise UserError(f"cannot read {file.path}: {exc}") from None


def read_specs(source: WeightDir | str | Path) -> dict[str, TensorSpec]:
    """Name -> shape and dtype of every tensor in the directory's safetensors headers (no data read)."""
    specs: dict[str, TensorSpec] = {}
    with opened(source) as weights:
        for file in weights.tensor_files:
            found = read_file_specs(file)
            twice = found.keys() & specs.keys()
            if twice:
                raise UserError(f"tensor {min(twice)} appears twice in {weights.path}")
            specs.update(found)
    return specs


def iter_tensors(source: WeightDir | str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the directory's `*.safetensors` files, read one at a time."""
    with opened(source) as weights:
        for file in weights.tensor_files:
            yield from file.tensors()


def _listed(names) -> str:
    names = sorted(names)
    more = f", ... ({len(names)} in all)" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_config(weights: WeightDir, reference: Reference) -> None:
    """Every ARCH_KEYS entry present in both configs must be equal."""
    config = read_config(weights)
    for key in ARCH_KEYS:
        if key in config and key in reference.config and config[key] != reference.config[key]:
            raise UserError(f"weights in {weights.path} are for another architecture: {key} = {config[key]!r}, "
                            f"the served model has {reference.config[key]!r}")


def dtype_fits(found: str, expected: str) -> bool:
    return found == expected or (expected in FLOATS and found in TRAINER_FLOATS)


def check_specs(path: str | Path, found: dict[str, TensorSpec], reference: Reference) -> None:
    """Names, shapes and dtypes of an update against the reference (see the module docstring)."""
    expected = reference.specs
    grouped = set().union(*reference.tied) if reference.tied else set()
    missing = [name for name in expected if name not in found and name not in grouped]
    missing += [" or ".join(sorted(group)) for group in reference.tied if not group & found.keys()]
    if missing:
        raise UserError(f"weights in {path} do not match the served model: {len(missing)} of {len(expected)} "
                        f"tensors missing ({_listed(missing)})")
    unexpected = found.keys() - expected.keys()
    if unexpected:
        raise UserError(f"weights in {path} do not match the served model: unexpected tensors ({_listed(unexpected)})")
    for name, spec in found.items():
        want = expected[name]
        if spec.shape != want.shape:
            raise UserError(f"weights in {path}: tensor {name} has shape {list(spec.shape)}, "
                            f"the served model {list(want.shape)}")
        if not dtype_fits(spec.dtype, want.dtype):
            raise UserError(f"weights in {path}: tensor {name} has dtype {spec.dtype}, the served model {want.dtype}")


def check_finite(path: str | Path, name: str, tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        raise UserError(f"weights in {path}: tensor {name} holds NaN or infinite values")


def verify_weight_dir(source: WeightDir | str | Path, reference: Reference | None,
                      keep: bool) -> dict[str, torch.Tensor]:
    """Run every check on a weight directory (an update's open `WeightDir`, or a trusted path); with `keep`,
    return its tensors (else an empty dict).

    Without a reference (a vLLM model from a hub cache that cannot be found) only the
    values are checked. Tied names present together must hold equal values.
    """
    with opened(source) as weights:
        path = weights.path
        if reference is not None:
            check_config(weights, reference)
            check_specs(path, read_specs(weights), reference)
        tensors: dict[str, torch.Tensor] = {}
        try:
            for name, tensor in iter_tensors(weights):
                check_finite(path, name, tensor)
                if keep:
                    tensors[name] = tensor
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"cannot read the weights in {path}: {exc}") from None
    if keep:
        check_tied(path, tensors, reference)
    return tensors


def check_tied(source: str | Path, tensors: dict[str, torch.Tensor], reference: Reference | None) -> None:
    """Tied names present together must hold equal values."""
    for group in reference.tied if reference is not None else ():
        values = [tensors[name] for name in sorted(group) if name in tensors]
        if any(not torch.equal(values[0], other) for other in values[1:]):
            raise UserError(f"weights in {source}: tied tensors {' and '.join(sorted(group))} differ")


def verify_tensors(source: str, tensors: dict[str, torch.Tensor], reference: Reference | None) -> None:
    """The checks of `verify_weight_dir` on tensors that came another way (the weight transfer): names, shapes and
    dtypes against the reference (none: values only), finite values, tied tensors equal."""
    if reference is not None:
        specs = {name: TensorSpec(tuple(t.shape), TORCH_DTYPES.get(t.dtype, str(t.dtype)))
                 for name, t in tensors.items()}
        check_specs(source, specs, reference)
    for name, tensor in tensors.items():
        check_finite(source, name, tensor)
    check_tied(source, tensors, reference)

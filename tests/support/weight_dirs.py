"""Weight directories that do not fit the served tiny model (shared by unit, integration and probe tests).

Each mismatch edits a copy of the model's directory: its tensors, its config.json, or both,
and names the words the server's 400 must contain.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"


def variant(model_dir: Path, path: Path, edit_tensors=None, edit_config=None) -> Path:
    """A copy of `model_dir` at `path` with its tensors and/or config.json edited in place."""
    path = Path(shutil.copytree(model_dir, path))
    if edit_tensors is not None:
        tensors = load_file(path / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, str(path / "model.safetensors"))
    if edit_config is not None:
        config = json.loads((path / "config.json").read_text())
        edit_config(config)
        (path / "config.json").write_text(json.dumps(config))
    return path


def _keep_one(tensors):
    for name in list(tensors)[1:]:
        del tensors[name]


def _rename_all(tensors):
    for name in list(tensors):
        tensors[f"prefix.{name}"] = tensors.pop(name)


def _set(name, make):
    return lambda tensors: tensors.__setitem__(name, make(tensors[name]))


def _poison(value):
    def edit(tensors):
        tensors[NORM] = tensors[NORM].clone()
        tensors[NORM][3] = value
    return edit


# name: (edit_tensors, edit_config, words of the 400). The tiny model: hidden 64, 2 layers, 25 names (24 + tied head).
MISMATCHES = {
    "missing_tensors": (_keep_one, None, "23 of 25 tensors missing"),
    "no_matching_keys": (_rename_all, None, "tensors missing"),
    "unexpected_tensor": (lambda t: t.__setitem__("extra.weight", torch.zeros(2)), None, "unexpected tensors"),
    "other_architecture": (None, lambda c: c.update(model_type="llama", architectures=["LlamaForCausalLM"]),
                           "another architecture"),
    "other_layer_count": (None, lambda c: c.update(num_hidden_layers=3), "num_hidden_layers = 3"),
    "wrong_shape": (_set(NORM, lambda t: torch.cat([t, t])), None, "has shape [128], the served model [64]"),
    "wrong_dtype_f64": (_set(NORM, lambda t: t.double()), None, "has dtype F64"),
    "wrong_dtype_int": (_set(NORM, lambda t: t.to(torch.int32)), None, "has dtype I32"),
    "nan_weights": (_poison(float("nan")), None, "NaN or infinite"),
    "inf_weights": (_poison(float("inf")), None, "NaN or infinite"),
}


def mismatched_dirs(model_dir: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Every mismatch as `root/<name>/step_1`: name -> (directory, words of the 400)."""
    made = {}
    for name, (edit_tensors, edit_config, words) in MISMATCHES.items():
        made[name] = (variant(model_dir, root / name / "step_1", edit_tensors, edit_config), words)
    return made


def check_weight_dir(path, step, roots) -> tuple:
    """The checks of `weights.open_update_dir`, the files closed again: (the resolved directory, its weight step)."""
    from prime_rl.inference.weight_dirs import open_update_dir

    with open_update_dir(path, step, roots) as weights:
        return weights.path, weights.step

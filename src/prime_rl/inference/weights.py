"""Weight directories (`weights/step_N/`: HF format, or a LoRA adapter) as both backends accept them.

A directory is accepted only under an allowed root (`Policy.weight_roots`: the config's
`weight_dirs` and the served model's own directory), judged after resolving symlinks and
`..`, so a link or a relative path cannot lead outside. The root check comes before any
look at the path, so a refused path reveals nothing about what exists there. The same
holds for every file read from it (`config.json`, `*.safetensors`): a file that is a link
leading outside the roots is refused too, and so is anything that is not a regular file
(a FIFO or a device would block the reader forever).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import step_number
from prime_rl.utils.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from prime_rl.utils.weight_transfer import MARKER, is_marker_dir


class WeightPathForbidden(UserError):
    """A weight path outside every allowed root (HTTP 403)."""


def resolve_allowed(path: str | Path, roots: Sequence[Path]) -> Path:
    """`path` resolved after symlinks, if that is one of `roots` or below one; else WeightPathForbidden."""
    try:
        real = Path(os.path.realpath(path))
    except (ValueError, OSError) as exc:  # an embedded NUL byte, a path too long
        raise UserError(f"invalid weight path: {exc}") from None
    if not roots:
        raise WeightPathForbidden(
            "this server loads no weight updates: no weight directory is allowed (start it with --weight-dirs)")
    if not any(real == root or real.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(root) for root in roots)
        raise WeightPathForbidden(f"weight path {path} is outside the allowed weight directories ({allowed})")
    return real


def regular_file(path: Path) -> Path:
    """`path` itself if it is (or links to) a regular file; else UserError. Never opens it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UserError(f"cannot read weight file {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"weight file {path} is not a regular file")
    return path


def weight_file(path: Path, roots: Sequence[Path] | None = None) -> Path:
    """`path` if it is a regular file (and, with `roots`, resolves under one of them: else
    WeightPathForbidden, judged first); checked before anything opens it."""
    if roots is not None:
        resolve_allowed(path, roots)
    return regular_file(path)


def safetensors_files(directory: str | Path, roots: Sequence[Path] | None = None) -> list[Path]:
    """The `*.safetensors` files of `directory`, sorted, each checked by `weight_file` (a FIFO would
    block `safe_open` forever); UserError when there is none. The one listing of a directory's tensors."""
    files = [weight_file(file, roots) for file in sorted(Path(directory).glob("*.safetensors"))]
    if not files:
        raise UserError(f"no *.safetensors files in {directory}")
    return files


def check_weight_dir(path: str | Path, step: int | None, roots: Sequence[Path]) -> tuple[Path, int]:
    """Validate a weight directory; return its resolved path and its weight step.

    The directory must resolve under one of `roots` (else `WeightPathForbidden`), exist
    and hold `config.json` and `*.safetensors` (full weights), `adapter_config.json` and
    `adapter_model.safetensors` (a LoRA adapter), or `transfer.json` (a marker: the weights came over the
    transfer group), all regular files resolving under `roots` too. The step is `step` when given, else parsed
    from the resolved directory's name `step_N`. Other problems raise `UserError`.
    """
    real = resolve_allowed(path, roots)
    try:
        if not real.exists():
            raise UserError(f"weight path {path} does not exist")
        if not real.is_dir():
            raise UserError(f"weight path {path} is not a directory")
        if is_marker_dir(real):  # weights that came over the transfer group (inference/transfer.py)
            weight_file(real / MARKER, roots)
        elif os.path.lexists(real / ADAPTER_CONFIG):  # a LoRA adapter (inference/adapter_check.py)
            for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
                if not os.path.lexists(real / name):
                    raise UserError(f"weight path {path} is an adapter directory without {name}")
                weight_file(real / name, roots)
        else:
            if not os.path.lexists(real / "config.json") or not any(real.glob("*.safetensors")):
                raise UserError(f"weight path {path} is not a weight directory (needs config.json and "
                                f"*.safetensors, or {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
            weight_file(real / "config.json", roots)
            safetensors_files(real, roots)
    except OSError as exc:
        raise UserError(f"cannot read weight path {path}: {exc.strerror}") from None
    if step is None:
        step = step_number(real.name)
        if step is None:
            raise UserError(f"cannot tell the weight step of {path}: name it step_N or pass 'step'")
    if step < 0:
        raise UserError(f"weight step must be >= 0 (got {step})")
    return real, step

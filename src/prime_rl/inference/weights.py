"""Weight directories (`weights/step_N/`, HF format) as both backends accept them."""

from __future__ import annotations

import re
from pathlib import Path

from prime_rl.utils.errors import UserError

STEP_DIR = re.compile(r"^step_(\d+)$")


def check_weight_dir(path: str | Path, step: int | None = None) -> tuple[Path, int]:
    """Validate a weight directory and return it with its weight step.

    The step is `step` when given, else parsed from the directory name `step_N`.
    Raises `UserError` naming what is wrong.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"weight path {path} does not exist")
    if not path.is_dir():
        raise UserError(f"weight path {path} is not a directory")
    if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
        raise UserError(f"weight path {path} is not a weight directory (needs config.json and *.safetensors)")
    if step is None:
        match = STEP_DIR.match(path.name)
        if match is None:
            raise UserError(f"cannot tell the weight step of {path}: name it step_N or pass 'step'")
        step = int(match.group(1))
    if step < 0:
        raise UserError(f"weight step must be >= 0 (got {step})")
    return path, step

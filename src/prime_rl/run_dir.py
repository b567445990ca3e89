"""Checkpoints in the run directory and the one rule for resuming from them.

    <output_dir>/checkpoints/step_N/trainer/        written by the trainer (or `sft`) after N optimizer steps
    <output_dir>/checkpoints/step_N/orchestrator/   written by the orchestrator after N rollout batches

Each part is written under a temporary name and renamed into place, its checksum
manifest written last (`utils/checksums.py`), so a part that exists is complete; the rules
here go by existence alone, and the loaders verify the manifest (a part without one is an
older version's or damaged: a one-line error at load, not skipped here). A checkpoint
step is *complete* when it has every part that this run writes: the parts found under
any step (trainer + orchestrator for `rl`, trainer alone for `sft` or a trainer run by
hand). The orchestrator runs up to `max_async_level + 1` steps ahead of the trainer, so
its newest parts have no trainer partner yet; they are not complete and never count.

- Resume ('latest') picks the newest complete step; an explicit step must be complete.
- Retention (`ckpt.keep = K`) keeps the newest K complete steps and everything newer
  (parts still waiting for their partner); older step directories go, both parts.
  Every writer prunes with this rule after its write, so the processes agree.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Literal

from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import list_steps, step_path

CHECKPOINTS = "checkpoints"
TRAINER = "trainer"
ORCHESTRATOR = "orchestrator"

_TEMPORARY = re.compile(r"^\..+\.tmp$")
"""Names `atomic_path`/`atomic_dir`/the checkpoint writers give to what they have not finished."""


def checkpoints_root(output_dir: Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def checkpoint_dir(output_dir: Path, step: int, part: str) -> Path:
    """`checkpoints/step_N/<part>`."""
    return step_path(checkpoints_root(output_dir), step) / part


def has_checkpoint(output_dir: Path, step: int, part: str) -> bool:
    return checkpoint_dir(output_dir, step, part).is_dir()


def parts_in_run(output_dir: Path) -> set[str]:
    """The parts any checkpoint step of this run holds."""
    root = checkpoints_root(output_dir)
    return {part for step in list_steps(root) for part in (TRAINER, ORCHESTRATOR)
            if has_checkpoint(output_dir, step, part)}


def complete_steps(output_dir: Path, parts: Collection[str] | None = None) -> list[int]:
    """Sorted steps that hold every part in `parts` (default: every part of the run, see the module docstring)."""
    parts = parts_in_run(output_dir) if parts is None else set(parts)
    if not parts:
        return []
    return [s for s in list_steps(checkpoints_root(output_dir))
            if all(has_checkpoint(output_dir, s, part) for part in parts)]


def resolve_resume_step(output_dir: Path, wanted: int | Literal["latest"] | None,
                        parts: Collection[str] | None = None) -> int | None:
    """The complete checkpoint step to resume from (None: start fresh); a one-line error otherwise.

    `parts`: the parts a complete step needs when the caller knows them (`rl`: trainer and
    orchestrator, so an orchestrator-only step of a run whose trainer never checkpointed,
    e.g. after its first save hit a full disk, is not complete); default: the parts found.
    """
    if wanted is None:
        return None
    complete = complete_steps(output_dir, parts)
    root = checkpoints_root(output_dir)
    if wanted == "latest":
        if not complete:
            raise UserError(f"ckpt.resume_step = 'latest' but {root} holds no complete checkpoint "
                            f"(parts found: {', '.join(sorted(parts_in_run(output_dir))) or 'none'})")
        return complete[-1]
    if wanted not in complete:
        raise UserError(f"ckpt.resume_step = {wanted}: no complete checkpoint {step_path(root, wanted)} "
                        f"(complete steps: {', '.join(map(str, complete)) or 'none'})")
    return wanted


def prune_checkpoints(output_dir: Path, keep: int | None) -> None:
    """Keep the newest `keep` complete steps and every step after them; delete older step directories."""
    if keep is None:
        return
    complete = complete_steps(output_dir)
    if len(complete) <= keep:
        return
    cutoff = complete[-keep]
    root = checkpoints_root(output_dir)
    for step in list_steps(root):
        if step < cutoff:
            shutil.rmtree(step_path(root, step), ignore_errors=True)


def remove_temporaries(output_dir: Path) -> list[Path]:
    """Delete what an interrupted atomic write left (`.<name>.<random>.tmp`, `.trainer.tmp`) in the
    run directory, its `rollouts/`, `weights/`, `configs/`, `checkpoints/` and `checkpoints/step_N/`.
    Only safe while no component of the run is writing (the launcher calls it before starting them)."""
    out = Path(output_dir)
    folders = [out, out / "rollouts", out / "weights", out / "configs", checkpoints_root(out)]
    folders += [step_path(checkpoints_root(out), s) for s in list_steps(checkpoints_root(out))]
    removed = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if _TEMPORARY.match(entry.name):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                removed.append(entry)
    return removed

"""Orchestrator checkpoints: `checkpoints/step_N/orchestrator/state.json`, beside the trainer's.

`step_N` means N rollout batches (steps 0..N-1) were written; resuming from it generates
step N next. The state is the step, how many examples each environment has yielded (its
data cursor: environments are deterministic per seed, so resume skips that many) and the
prompt-sampling RNG. Written atomically.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from prime_rl.configs.shared import CkptConfig
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import atomic_dir, list_steps, prune_steps, step_path

SUBDIR = "orchestrator"
STATE_FILE = "state.json"


@dataclass
class OrchestratorState:
    step: int = 0
    env_cursors: dict[str, int] = field(default_factory=dict)
    rng_state: list | None = None

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "env_cursors": self.env_cursors, "rng_state": self.rng_state})

    @classmethod
    def from_json(cls, text: str) -> OrchestratorState:
        data = json.loads(text)
        return cls(step=int(data["step"]), env_cursors=dict(data["env_cursors"]), rng_state=data["rng_state"])


def rng_to_json(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: list) -> random.Random:
    rng = random.Random()
    rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng


def checkpoints_dir(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def save_state(output_dir: Path, state: OrchestratorState, keep: int | None = None) -> Path:
    target = step_path(checkpoints_dir(output_dir), state.step) / SUBDIR
    with atomic_dir(target) as tmp:
        (tmp / STATE_FILE).write_text(state.to_json())
    prune_steps(checkpoints_dir(output_dir), keep, subdir=SUBDIR)
    return target


def has_checkpoint(output_dir: Path, step: int, part: str) -> bool:
    """Whether `part` ("orchestrator" or "trainer") saved a checkpoint of `step`."""
    return (step_path(checkpoints_dir(output_dir), step) / part).is_dir()


def resolve_resume_step(output_dir: Path, ckpt: CkptConfig) -> int | None:
    """The checkpoint step to resume from, or None for a fresh start.

    'latest' is the newest step with an orchestrator checkpoint and, if the trainer has
    written any checkpoint in this run, a trainer checkpoint too (the orchestrator runs
    ahead of the trainer, so its newest may not have a trainer partner yet).
    """
    if ckpt.resume_step is None:
        return None
    steps = list_steps(checkpoints_dir(output_dir))
    ours = [s for s in steps if has_checkpoint(output_dir, s, SUBDIR)]
    if ckpt.resume_step == "latest":
        if any(has_checkpoint(output_dir, s, "trainer") for s in steps):
            ours = [s for s in ours if has_checkpoint(output_dir, s, "trainer")]
        if not ours:
            raise UserError(f"ckpt.resume_step = 'latest' but {checkpoints_dir(output_dir)} has no orchestrator checkpoint")
        return ours[-1]
    if ckpt.resume_step not in ours:
        raise UserError(
            f"no orchestrator checkpoint for step {ckpt.resume_step} in {checkpoints_dir(output_dir)} "
            f"(available: {', '.join(map(str, ours)) or 'none'})"
        )
    return ckpt.resume_step


def load_state(output_dir: Path, step: int) -> OrchestratorState:
    path = step_path(checkpoints_dir(output_dir), step) / SUBDIR / STATE_FILE
    try:
        return OrchestratorState.from_json(path.read_text())
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read orchestrator checkpoint {path}: {exc}") from None

"""Orchestrator checkpoints: `checkpoints/step_N/orchestrator/state.json`, beside the trainer's.

`step_N` means N rollout batches (steps 0..N-1) were written; resuming from it generates
step N next. The state is the step, how many examples each environment has yielded (its
data cursor: environments are deterministic per seed, so resume skips that many), the
prompt-sampling RNG and, with `[orchestrator.curriculum]`, the curriculum's RNG and every seen
example's window of groups (`curriculum.Curriculum.state`; absent in older checkpoints).
Written atomically with a `manifest.json` (size and sha256 of state.json,
`utils/checksums.py`) that `load_state` verifies before reading: a missing, changed or
extra file, or no manifest, is a one-line `UserError`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from prime_rl.orchestrator.examples.curriculum import state_problem
from prime_rl.run_dir import ORCHESTRATOR, ORCHESTRATOR_STATE, TRAINER, checkpoint_dir, prune_checkpoints
from prime_rl.utils.checksums import verify_manifest, write_manifest
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import atomic_dir
from prime_rl.utils.json_state import dumps_exact, python_rng_from_json, python_rng_to_json


@dataclass
class OrchestratorState:
    step: int = 0
    env_cursors: dict[str, int] = field(default_factory=dict)
    rng_state: list | None = None
    curriculum: dict | None = None  # `Curriculum.state()`; None: no curriculum (or a checkpoint from before one)

    def to_json(self) -> str:
        data = {"step": self.step, "env_cursors": self.env_cursors, "rng_state": self.rng_state}
        if self.curriculum is not None:
            data["curriculum"] = self.curriculum
        return dumps_exact(data, "orchestrator state")

    @classmethod
    def from_json(cls, text: str) -> OrchestratorState:
        """Parse and check the state: a step and cursors that are non-negative integers, a curriculum of the shape
        `Curriculum.state()` writes (ValueError otherwise)."""
        data = json.loads(text)
        state = cls(step=data["step"], env_cursors=dict(data["env_cursors"]), rng_state=data["rng_state"],
                    curriculum=data.get("curriculum"))
        for name, value in {"step": state.step, **state.env_cursors}.items():
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                raise ValueError(f"{name} = {value!r} is not a step count")
        problem = None if state.curriculum is None else state_problem(state.curriculum)
        if problem:
            raise ValueError(problem)
        return state


def rng_to_json(rng: random.Random) -> list:
    return python_rng_to_json(rng.getstate())


def rng_from_json(state: list) -> random.Random:
    rng = random.Random()
    rng.setstate(python_rng_from_json(state))
    return rng


def save_state(output_dir: Path, state: OrchestratorState, keep: int | None = None) -> Path:
    """Write `checkpoints/step_N/orchestrator/` and apply the run's retention rule (`run_dir`)."""
    target = checkpoint_dir(output_dir, state.step, ORCHESTRATOR)
    with atomic_dir(target) as tmp:
        (tmp / ORCHESTRATOR_STATE).write_text(state.to_json())
        write_manifest(tmp)
    prune_checkpoints(output_dir, keep, parts=(TRAINER, ORCHESTRATOR))  # it never runs without a trainer
    return target


def load_state(output_dir: Path, step: int) -> OrchestratorState:
    """The state of `checkpoints/step_N/orchestrator/` after verifying its manifest; a one-line `UserError`
    otherwise."""
    directory = checkpoint_dir(output_dir, step, ORCHESTRATOR)
    verify_manifest(directory)
    path = directory / ORCHESTRATOR_STATE
    try:
        state = OrchestratorState.from_json(path.read_text())
        for rng_state in (state.rng_state, (state.curriculum or {}).get("rng")):
            if rng_state is not None:
                rng_from_json(rng_state)  # a state random.setstate refuses fails here, in one line
        return state
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read orchestrator checkpoint {path}: {exc}") from None

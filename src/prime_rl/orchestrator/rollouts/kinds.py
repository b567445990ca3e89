"""The rollout kinds a run can use, each with the builder of its runner (`seam.RolloutRunner`).

A new kind of rollout is one module with a runner class (a `build(context)` classmethod, `run_group` returning the
draw's scored `Group`, and `stop`), one line that registers it, and an environment whose `rollout_kind` names it:

    register_rollout_kind("my_kind", MyRunner.build)   # beside the runner, or in the environment's module

An environment loaded by import path (`id = "my_pkg.envs:MyEnv"`) imports its module, so a registration there is
in place before the run builds its runners.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prime_rl.orchestrator.rollouts.agents.runner import AgentRunner
from prime_rl.orchestrator.rollouts.multi_turn import ConversationRunner
from prime_rl.orchestrator.rollouts.seam import RolloutRunner, RunnerContext
from prime_rl.orchestrator.rollouts.single_turn import SingleTurnRunner
from prime_rl.utils.errors import UserError

RUNNERS: dict[str, Callable[[RunnerContext], RolloutRunner]] = {
    "single_turn": SingleTurnRunner.build,
    "multi_turn": ConversationRunner.build,
    "agent": AgentRunner.build,
}


def register_rollout_kind(kind: str, build: Callable[[RunnerContext], RolloutRunner]) -> None:
    """Make `kind` a rollout kind whose runner `build` makes (once per run that uses it)."""
    RUNNERS[kind] = build


def build_runners(kinds: Iterable[str], context: RunnerContext) -> dict[str, RolloutRunner]:
    """One runner for each of `kinds` (the run's environments' rollout kinds)."""
    runners = {}
    for kind in sorted(set(kinds)):
        if kind not in RUNNERS:
            raise UserError(f"no runner for rollout kind {kind!r} (known: {', '.join(sorted(RUNNERS))}; "
                            "register_rollout_kind adds one)")
        runners[kind] = RUNNERS[kind](context)
    return runners

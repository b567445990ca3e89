"""The seam between the orchestrator's loop and the rollouts it trains on: a `RolloutCollector` gives the loop
each step's scored groups, and the loop never asks how they were made.

Two implementations, chosen by `rollout_mode`:

- `step_collector.StepCollector` ("step"): each step waits for weights within `max_async_level`, then
  generates its whole batch (dynamic sampling's extra rounds included); nothing is in flight between steps.
- `continuous_collector.ContinuousCollector` ("continuous"): requests stay in flight across steps, weights load
  in flight as the trainer writes them, and each batch takes groups as they finish.

Both are built from the same `Collaborators`, handed to them by whoever composes the orchestrator, and the
settings of the config that say how a batch fills. A collector owns its own state only (what is
in flight, its clocks); it reports what it measured as the step's generation metrics.

A step calls `prepare(step, evaluating)` at the start of its generation phase (before the step's evaluation,
which needs the weights bound too), then `collect(step)`; `stop()` ends the run's collection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from prime_rl.orchestrator.examples.draws import ExampleSource
from prime_rl.orchestrator.group_advantages import GroupAdvantages
from prime_rl.orchestrator.rollouts.generator import GroupGenerator
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.orchestrator.weight_sync import WeightSync


@dataclass(frozen=True)
class Collaborators:
    """What a collector is built from; it owns none of them (the orchestrator shares them: the draws' cursors are
    its checkpoint, the weight sync its start-up alignment)."""

    generator: GroupGenerator  # draws to scored groups: the client or server pool, n, sampling rule and settings
    source: ExampleSource  # the example draws
    sync: WeightSync  # the served weights and the lag bound
    advantages: GroupAdvantages  # which groups carry no signal


@dataclass
class Collected:
    """One step's rollouts, as a collector hands them to the loop."""

    groups: list[Group]  # every group generated for the step (those filtered out included: the reward metrics)
    kept: list[Group]  # the groups that train (at most batch_size / rollouts_per_example)
    metrics: dict[str, float]
    """perf/wait_for_weights_s, perf/inference_tokens_per_s, async/inference_idle_frac, and what is particular to
    the mode (continuous: async/stale_groups)."""
    stale: list[Group] = field(default_factory=list)
    """Groups that finished too late for the step's batch and were dropped (continuous mode): scored, never trained,
    in no metric but async/stale_groups; the curriculum still counts their pass rates."""


class RolloutCollector(Protocol):
    """What the loop calls, in this order per step: `prepare`, (the step's evaluation), `collect`; `stop` once."""

    async def prepare(self, step: int, evaluating: bool) -> None:
        """The start of `step`'s generation phase: make the server serve the weights that the step's evaluation
        (when `evaluating`) and this collector's first requests need (waiting for the trainer's if they are
        not there yet). The wait is reported in `collect`'s metrics."""

    async def collect(self, step: int) -> Collected:
        """`step`'s groups: every one generated for it and those that train, with the generation metrics."""

    async def stop(self) -> None:
        """End the collection: cancel what is still in flight (the run is over or failed)."""


def tokens_per_s(groups: list[Group], seconds: float) -> float:
    """`perf/inference_tokens_per_s`: the completion tokens of `groups` over the seconds spent generating them."""
    return sum(len(p.completion.token_ids) for g in groups for p in g.all_trained()) / max(seconds, 1e-9)

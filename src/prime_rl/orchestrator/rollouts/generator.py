"""Turning draws into scored groups.

A *group* is one example with its `n` rollouts, each scored by the example's environment (`scoring.py`). How a
rollout is run is its environment's rollout kind (`seam.py`): one chat completion (`single_turn.py`), a
conversation run token-in, token-out (`multi_turn.py`), an agent's session through the gateway, one sample per
segment (`agents/`), or a kind of your own (`kinds.py`). `GroupGenerator` is the one way a draw becomes a group:
it holds what every request of a run shares (`n`, the sampling rule, the `RolloutSettings`) and the run's runner
of each kind; the rollout collectors (`orchestrator/collector.py`) and the evaluation use it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.orchestrator.rollouts.seam import RolloutRunner, RolloutSettings


def request_seed(seed: int, step: int, index: int) -> int:
    """A per-request sampling seed, so a (resumed) run's rollouts repeat given the same weights."""
    return ((seed * 1_000_003 + step) * 100_003 + index * 1_009) % (2**31 - 1)


@dataclass(frozen=True)
class GroupGenerator:
    """Draws to scored groups: `n` rollouts of each draw under `rule` and `settings`, run by `runners[kind]` for
    the draw's environment's rollout kind (`kinds.build_runners` makes one per kind of the run)."""

    runners: dict[str, RolloutRunner]
    n: int
    rule: SamplingRule
    settings: RolloutSettings

    async def generate(self, draws: list[Draw], seeds: list[int | None]) -> list[Group]:
        """One scored group per draw, in the draws' order; `seeds[i]` seeds draw i's request."""
        return list(await asyncio.gather(*(self._group(d, s) for d, s in zip(draws, seeds, strict=True))))

    async def _group(self, draw: Draw, seed: int | None) -> Group:
        runner = self.runners[draw.environment.rollout_kind]
        return await runner.run_group(draw, self.n, self.rule, self.settings, seed)

    async def stop(self) -> None:
        """Stop every runner (an agent runner's gateway server)."""
        for runner in self.runners.values():
            await runner.stop()

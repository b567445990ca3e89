"""Step-wise rollouts (`rollout_mode = "step"`, the default): each step generates its whole batch.

At the start of step n's generation phase the server must serve weights m >= n - max_async_level (waiting
for the trainer's when they are not there: `WeightSync.ensure`; a weight update drains the server, so no
response mixes two weight steps). Then batch_size / rollouts_per_example examples are drawn and generated, one
group request each, with seeds from (seed, step, index): given the same weights the same seeds give the same
rollouts. A group with too few rollouts left after failures (`GroupAdvantages.usable`) never trains; with
`filter_zero_advantage` the zero-advantage groups do not train either; with `dynamic_sampling` more
examples are drawn for the missing groups, up to `dynamic_sampling_max_rounds` extra rounds (then the step
trains on what it has). Nothing is in flight between steps, so the server idles outside generation:
`async/inference_idle_frac` = 1 - generation time / the phase (weights wait + evaluation + generation).
"""

from __future__ import annotations

import time

from prime_rl.orchestrator.collector import Collaborators, Collected, tokens_per_s
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.generator import request_seed
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")


class StepCollector:
    """The step-wise `RolloutCollector`. Owns only its step's clocks; the draws, weights and groups come from its
    `Collaborators`; of `config` it reads the seed and how a batch fills (batch_size, rollouts_per_example,
    filter_zero_advantage, dynamic_sampling, dynamic_sampling_max_rounds)."""

    def __init__(self, parts: Collaborators, config: OrchestratorConfig):
        self.parts = parts
        self.seed = config.seed
        self.needed = config.batch_size // config.rollouts_per_example
        self.filtering = config.filter_zero_advantage or config.dynamic_sampling
        self.dynamic_sampling = config.dynamic_sampling
        self.max_rounds = config.dynamic_sampling_max_rounds
        self.phase_start = time.monotonic()  # of the step being generated (`prepare`)
        self.waited = 0.0  # for its weights
        self.generation_s = 0.0  # spent in its requests

    async def prepare(self, step: int, evaluating: bool) -> None:
        self.phase_start = time.monotonic()
        self.waited = await self.parts.sync.ensure(step)  # the batch and the evaluation alike

    async def collect(self, step: int) -> Collected:
        """The batch of `step`, with dynamic sampling's extra rounds (module docstring)."""
        self.generation_s = 0.0
        groups = await self._generate(self.parts.source.draw(self.needed), step, 0)
        rounds = 0
        while True:
            advantages = self.parts.advantages
            usable = [g for g in groups if advantages.usable(g)]
            zero = advantages.zero(usable) if self.filtering else [False] * len(usable)
            kept = [g for g, z in zip(usable, zero, strict=True) if not z]
            missing = self.needed - len(kept)
            if not self.dynamic_sampling or missing <= 0 or rounds >= self.max_rounds:
                break
            rounds += 1
            groups += await self._generate(self.parts.source.draw(missing), step, len(groups))
        if rounds and missing > 0:
            log.warning(f"step {step}: dynamic sampling stopped after {rounds} extra rounds with {len(kept)}/"
                        f"{self.needed} informative groups")
        phase = time.monotonic() - self.phase_start
        metrics = {
            "perf/wait_for_weights_s": self.waited,
            "perf/inference_tokens_per_s": tokens_per_s(groups, self.generation_s),
            # requests are in flight only while a batch is generated
            "async/inference_idle_frac": max(0.0, 1 - self.generation_s / max(phase, 1e-9)),
        }
        return Collected(groups, kept[:self.needed], metrics)

    async def _generate(self, draws: list[Draw], step: int, first_index: int) -> list[Group]:
        seeds = [request_seed(self.seed, step, first_index + i) for i in range(len(draws))]
        start = time.monotonic()
        groups = await self.parts.generator.generate(draws, seeds)
        self.generation_s += time.monotonic() - start
        return groups

    async def stop(self) -> None:
        """Nothing outlives a step's `collect`."""

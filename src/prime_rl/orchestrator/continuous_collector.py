"""Continuous rollouts (`rollout_mode = "continuous"`, PipelineRL-style): generation never stops at a step
boundary.

A producer keeps up to `client.max_concurrency` group requests (one prompt, `n` completions)
in flight. Each step's batch takes finished, scored groups in the order they finish. New
weights are loaded as soon as the trainer writes them, *in flight*: the server swaps them
between two decode iterations without draining, and every token records the weight step it
was sampled under (`token_weight_steps`).

The lag bound holds per token: the batch of step n holds only tokens sampled under weight
steps >= n - max_async_level.
- A request starts only while the served step is >= t - max_async_level, where t is the
  step its group is expected to land in: the step being filled plus the groups already
  kept, queued or in flight, in batches of `batch_size / rollouts_per_example`.
- A finished group whose oldest token is too old for the batch it lands in is dropped
  (`async/stale_groups`).
- When nothing can start and nothing is in flight, the orchestrator waits for the trainer's
  weights (`perf/wait_for_weights_s`).

A group with too few rollouts left after failures (`GroupAdvantages.usable`) is dropped, and with
`filter_zero_advantage` so is a zero-advantage one; the producer simply draws more, up
to `1 + dynamic_sampling_max_rounds` batches' worth of finished groups per step; then the
step trains on what it has (as step mode's dynamic sampling does), so a task where every
group ties cannot stall the run.
Groups in flight at a checkpoint are not in it: a resumed run skips their prompts.

`ContinuousCollector` is the continuous `RolloutCollector` (`orchestrator/collector.py`): built from the same
collaborators as the step-wise one, it owns only its producer (the requests in flight, the queue of finished
groups, the request count that seeds them) and its idle clock.
"""

from __future__ import annotations

import asyncio
import time

from prime_rl.orchestrator.collector import Collaborators, Collected, tokens_per_s
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.generator import request_seed
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.utils.logging import get_logger

POLL_S = 0.05  # how often a waiting batch also looks for new weights
log = get_logger("orchestrator")


class IdleClock:
    """Seconds during which no request was in flight."""

    def __init__(self):
        self.total = 0.0
        self.since: float | None = time.monotonic()  # idle until the first request starts

    def busy(self) -> None:
        if self.since is not None:
            self.total += time.monotonic() - self.since
            self.since = None

    def idle(self) -> None:
        self.since = time.monotonic()

    def read(self) -> float:
        return self.total + (time.monotonic() - self.since if self.since is not None else 0.0)


class ContinuousCollector:
    """The continuous `RolloutCollector` (module docstring), from its `Collaborators`. Of `config` it reads the
    seed, how a batch fills (batch_size, rollouts_per_example, filter_zero_advantage, dynamic_sampling_max_rounds),
    the lag bound (max_async_level) and how many requests may be in flight (client.max_concurrency)."""

    def __init__(self, parts: Collaborators, config: OrchestratorConfig):
        self.parts = parts
        self.seed = config.seed
        self.needed = config.batch_size // config.rollouts_per_example
        self.most = self.needed * (1 + config.dynamic_sampling_max_rounds)  # finished groups a batch may look at
        self.filtering = config.filter_zero_advantage
        self.max_async_level = config.max_async_level
        self.max_concurrency = config.client.max_concurrency
        self.finished: asyncio.Queue[Group | BaseException] = asyncio.Queue()
        self.in_flight = 0
        self.requests = 0  # seeds: a running count
        self.tasks: set[asyncio.Task] = set()
        self.clock = IdleClock()
        self.waited = 0.0  # for weights before the step's evaluation (`prepare`)

    async def prepare(self, step: int, evaluating: bool) -> None:
        # The batch's own requests load weights as they go (`collect`); evaluation rollouts keep the lag bound too.
        self.waited = await self.parts.sync.ensure(step) if evaluating else 0.0

    def expected_step(self, step: int, kept: int) -> int:
        """The step a group started now would land in."""
        return step + (kept + self.in_flight + self.finished.qsize()) // self.needed

    def top_up(self, step: int, kept: int) -> None:
        while self.in_flight < self.max_concurrency:
            target = self.expected_step(step, kept)
            if self.parts.sync.served_step < target - self.max_async_level:
                return  # its tokens would be too old for its batch: wait for newer weights
            (draw,) = self.parts.source.draw(1)
            self.start(draw, request_seed(self.seed, target, self.requests))
            self.requests += 1

    def start(self, draw: Draw, seed: int) -> None:
        if self.in_flight == 0:
            self.clock.busy()
        self.in_flight += 1
        task = asyncio.create_task(self.one(draw, seed))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def one(self, draw: Draw, seed: int) -> None:
        try:
            (item,) = await self.parts.generator.generate([draw], [seed])
        except Exception as exc:  # raised by the batch that takes it
            item = exc
        self.in_flight -= 1
        if self.in_flight == 0:
            self.clock.idle()
        self.finished.put_nowait(item)

    def is_stale(self, group: Group, step: int) -> bool:
        """Whether a token of a rollout that trains (a failure left out does not count) is older than the bound."""
        oldest = min((group.policy_step(i) for i in range(len(group.rewards)) if group.trains(i)), default=step)
        return step - oldest > self.max_async_level

    async def collect(self, step: int) -> Collected:
        """Fills the batch of `step` with the groups that finish for it (module docstring)."""
        start, idle_before = time.monotonic(), self.clock.read()
        groups: list[Group] = []
        kept: list[Group] = []
        stale: list[Group] = []
        waited = 0.0
        while len(kept) < self.needed and len(groups) < self.most:
            await self.parts.sync.load_newest(at_most=step)
            self.top_up(step, len(kept))
            if self.in_flight == 0 and self.finished.empty():
                waited += await self.parts.sync.ensure(step)  # blocked by the trainer
                continue
            try:
                item = await asyncio.wait_for(self.finished.get(), POLL_S)
            except TimeoutError:
                continue
            if isinstance(item, BaseException):
                raise item
            if self.is_stale(item, step):
                stale.append(item)
                continue
            groups.append(item)
            if not self.parts.advantages.usable(item) or (self.filtering and self.parts.advantages.zero([item])[0]):
                continue
            kept.append(item)
        if len(kept) < self.needed:
            log.warning(f"step {step}: {len(groups)} finished groups held only {len(kept)}/{self.needed} that can "
                        "train (a nonzero advantage when filtering, enough rollouts left after failures; at most 1 + "
                        "dynamic_sampling_max_rounds batches' worth are looked at)")
        elapsed = time.monotonic() - start
        idle = self.clock.read() - idle_before
        metrics = {
            "perf/wait_for_weights_s": waited + self.waited,
            "async/stale_groups": float(len(stale)),
            "async/inference_idle_frac": min(1.0, idle / max(elapsed, 1e-9)),
            "perf/inference_tokens_per_s": tokens_per_s(groups, elapsed - idle),
        }
        return Collected(groups, kept, metrics, stale)

    async def stop(self) -> None:
        """Cancel what is still in flight (the run is over)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

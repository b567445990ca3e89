"""Continuous rollouts (`rollout_mode = "continuous"`): generation never stops at a step boundary.

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

`filter_zero_advantage` drops zero-advantage groups and the producer simply draws more, up
to `1 + dynamic_sampling_max_rounds` batches' worth of finished groups per step; then the
step trains on what it has (as step mode's dynamic sampling does), so a task where every
group ties cannot stall the run.
Groups in flight at a checkpoint are not in it: a resumed run skips their prompts.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from prime_rl.orchestrator.advantage import compute_advantages, zero_groups
from prime_rl.orchestrator.rollouts import Draw, Group, generate_groups, request_seed
from prime_rl.utils.logging import get_logger

if TYPE_CHECKING:
    from prime_rl.orchestrator.orchestrator import Orchestrator

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


class ContinuousRollouts:
    def __init__(self, orch: Orchestrator):
        self.orch = orch
        c = orch.config
        self.group_size = c.rollouts_per_example
        self.needed = c.batch_size // c.rollouts_per_example
        self.finished: asyncio.Queue[Group | BaseException] = asyncio.Queue()
        self.in_flight = 0
        self.requests = 0  # seeds: a running count
        self.tasks: set[asyncio.Task] = set()
        self.clock = IdleClock()

    def expected_step(self, step: int, kept: int) -> int:
        """The step a group started now would land in."""
        return step + (kept + self.in_flight + self.finished.qsize()) // self.needed

    def top_up(self, step: int, kept: int) -> None:
        c = self.orch.config
        while self.in_flight < c.client.max_concurrency:
            target = self.expected_step(step, kept)
            if self.orch.sync.served_step < target - c.max_async_level:
                return  # its tokens would be too old for its batch: wait for newer weights
            (draw,) = self.orch.source.draw(1)
            self.start(draw, request_seed(c.seed, target, self.requests))
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
            (item,) = await generate_groups(self.orch.client, [draw], self.group_size, self.orch.config.sampling.rule,
                                            self.orch.settings,
                                            [seed], self.orch.conversations)
        except Exception as exc:  # raised by the batch that takes it
            item = exc
        self.in_flight -= 1
        if self.in_flight == 0:
            self.clock.idle()
        self.finished.put_nowait(item)

    def is_stale(self, group: Group, step: int) -> bool:
        oldest = min(group.result.policy_step(c) for c in group.result.completions)
        return step - oldest > self.orch.config.max_async_level

    async def collect(self, step: int) -> tuple[list[Group], list[Group], dict[str, float]]:
        """(the groups that finished for this batch, the ones that train, metrics): fills the batch of `step`."""
        c = self.orch.config
        start, idle_before = time.monotonic(), self.clock.read()
        groups: list[Group] = []
        kept: list[Group] = []
        stale = 0
        waited = 0.0
        most = self.needed * (1 + c.dynamic_sampling_max_rounds)  # finished groups a batch may look at
        while len(kept) < self.needed and len(groups) < most:
            await self.orch.sync.load_newest(at_most=step)
            self.top_up(step, len(kept))
            if self.in_flight == 0 and self.finished.empty():
                waited += await self.orch.sync.ensure(step)  # blocked by the trainer
                continue
            try:
                item = await asyncio.wait_for(self.finished.get(), POLL_S)
            except TimeoutError:
                continue
            if isinstance(item, BaseException):
                raise item
            if self.is_stale(item, step):
                stale += 1
                continue
            groups.append(item)
            rewards = self.orch.rewards([item])
            if c.filter_zero_advantage and bool(zero_groups(compute_advantages(c.advantage, rewards))[0]):
                continue
            kept.append(item)
        if len(kept) < self.needed:
            log.warning(f"step {step}: {len(groups)} finished groups held only {len(kept)}/{self.needed} with a "
                        "nonzero advantage (at most 1 + dynamic_sampling_max_rounds batches' worth are looked at)")
        elapsed = time.monotonic() - start
        idle = self.clock.read() - idle_before
        self.orch.generation_s += elapsed - idle
        self.orch.generated_tokens += sum(len(c.token_ids) for g in groups for c in g.result.completions)
        metrics = {
            "perf/wait_for_weights_s": waited,
            "async/stale_groups": float(stale),
            "async/inference_idle_frac": min(1.0, idle / max(elapsed, 1e-9)),
        }
        return groups, kept, metrics

    async def close(self) -> None:
        """Cancel what is still in flight (the run is over)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

"""Keep the served weights within `max_async_level` steps of the step being generated.

The rollouts of step n may come from weights of step m only if n - m <= max_async_level,
so before generating step n the server must serve some m >= m_min = max(0, n - max_async_level).
Weight step 0 is the initial model the server starts with; the trainer writes
`weights/step_k/` (atomically) after finishing k steps and keeps only the newest few.
Whenever a newer directory than the served one exists we load the newest (less lag for
free); when the served step is below m_min we wait for one, up to `weights_timeout_s`.
Never newer than the step being generated (weights m need rollouts m - 1, so a newer
directory can only be a leftover), and after a resume from step N a directory above N
counts only if it was written (its mtime) after this process started (the resumed trainer
rewrites them).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from prime_rl.orchestrator.client import InferenceClient, InferenceError
from prime_rl.run_dir import weights_dir, weights_root
from prime_rl.utils.fs import WaitTimeout, list_steps
from prime_rl.utils.logging import get_logger


def min_weight_step(step: int, max_async_level: int) -> int:
    return max(0, step - max_async_level)


class WeightSync:
    def __init__(self, client: InferenceClient, output_dir: Path, max_async_level: int, timeout_s: float,
                 served_step: int = 0, trusted_upto: int = 0, poll_s: float = 0.05, in_flight: bool = False):
        self.client = client
        self.output_dir = Path(output_dir)
        self.max_async_level = max_async_level
        self.timeout_s = timeout_s
        self.served_step = served_step
        self.poll_s = poll_s
        self.trusted_upto = trusted_upto
        self.in_flight = in_flight  # load without draining the server (continuous rollouts)
        # Filesystem timestamps come from a coarse clock that can lag time.time() by a few ms.
        self.started_at = time.time() - 1.0
        self.log = get_logger("orchestrator")

    def _usable(self, step: int) -> bool:
        if step <= self.trusted_upto:
            return True
        try:
            return weights_dir(self.output_dir, step).stat().st_mtime >= self.started_at
        except FileNotFoundError:
            return False

    async def load_newest(self, at_most: int) -> bool:
        """Load the newest usable weights/step_K with served step < K <= at_most; True if loaded."""
        for _ in range(3):  # the trainer may prune a directory between listing and loading
            steps = [s for s in list_steps(weights_root(self.output_dir)) if s <= at_most and self._usable(s)]
            if not steps or steps[-1] <= self.served_step:
                return False
            newest = steps[-1]
            try:
                self.served_step = await self.client.update_weights(str(weights_dir(self.output_dir, newest)), newest,
                                                                    self.in_flight)
            except InferenceError:
                if weights_dir(self.output_dir, newest).is_dir():
                    raise
                continue
            self.log.info(f"inference now serves weights step {self.served_step}")
            return True
        return False

    async def align(self, initial_model: str) -> None:
        """Start from what the server really serves: a step above `trusted_upto` is a leftover of another run
        (a server that was not restarted), so load the newest usable weights, else the initial model as step 0."""
        steps = await self.client.served_steps()  # one per server
        self.served_step = min(steps)
        if max(steps) <= self.trusted_upto and len(set(steps)) == 1:
            return
        self.log.info(f"the server(s) serve weights steps {sorted(set(steps))}: ahead of this run or not all the "
                      "same: reloading")
        self.served_step = -1
        if not await self.load_newest(at_most=self.trusted_upto):
            self.served_step = await self.client.update_weights(initial_model, 0)

    async def ensure(self, step: int) -> float:
        """Make the server serve weights >= min_weight_step(step); return the seconds spent waiting."""
        need = min_weight_step(step, self.max_async_level)
        start = time.monotonic()
        await self.load_newest(at_most=step)
        logged = False
        while self.served_step < need:
            waited = time.monotonic() - start
            if waited > self.timeout_s:
                raise WaitTimeout(
                    f"timed out after {self.timeout_s:.0f}s waiting for the trainer's weights step >= {need} "
                    f"({weights_dir(self.output_dir, need)}) to generate step {step} with max_async_level "
                    f"{self.max_async_level}"
                )
            if not logged:
                self.log.info(f"step {step}: waiting for weights step >= {need} (serving {self.served_step})")
                logged = True
            await asyncio.sleep(min(self.poll_s * (1 + waited), 0.5))
            await self.load_newest(at_most=step)
        return time.monotonic() - start

"""Which weights serve a request: the one rule both backends share.

A request is admitted under the current weight step and keeps it to the end. A weight
update closes the gate to new requests, waits until every admitted request has
finished (they finish on the old weights), swaps the weights, then reopens. So no
response mixes two weight versions, and each carries the step that produced it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class GateTimeout(Exception):
    """A request or an update waited longer than the gate's timeout."""


class WeightGate:
    def __init__(self, step: int = 0, timeout_s: float = 600.0):
        self.step = step
        self.timeout_s = timeout_s
        self._active = 0
        self._updating = False
        self._cond = asyncio.Condition()

    @property
    def active(self) -> int:
        return self._active

    async def _wait(self, predicate, what: str) -> None:
        try:
            await asyncio.wait_for(self._cond.wait_for(predicate), self.timeout_s)
        except TimeoutError:
            raise GateTimeout(f"timed out after {self.timeout_s:.0f}s waiting for {what}") from None

    @asynccontextmanager
    async def request(self) -> AsyncIterator[int]:
        """Admit one request; yields the weight step it is served with."""
        async with self._cond:
            await self._wait(lambda: not self._updating, "a weight update to finish")
            self._active += 1
            step = self.step
        try:
            yield step
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def update(self, new_step: int) -> AsyncIterator[None]:
        """Hold new requests and drain admitted ones; the body swaps the weights.

        The step becomes `new_step` only if the body succeeds.
        """
        async with self._cond:
            await self._wait(lambda: not self._updating, "another weight update to finish")
            self._updating = True
            try:
                await self._wait(lambda: self._active == 0, "in-flight requests to finish")
            except GateTimeout:
                self._updating = False
                self._cond.notify_all()
                raise
        try:
            yield
            self.step = new_step
        finally:
            async with self._cond:
                self._updating = False
                self._cond.notify_all()

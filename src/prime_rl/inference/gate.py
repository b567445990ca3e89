"""Which weights serve a request: the one rule both backends share.

A request is admitted under the current weight step. A *draining* update (the default)
closes the gate to new requests, waits until every admitted request has finished (they
finish on the old weights), swaps the weights, then reopens: no response mixes two
weight versions. An *in-flight* update (builtin backend; vLLM >= 0.32) neither waits for nor holds
requests: the engine swaps the weights between two decode iterations (vLLM: during a kept pause), and running
requests go on under the new ones (each token records the step it was sampled under), so
an in-flight update never goes back to an older step (a UserError: 400). vLLM's "resubmit" in-flight updates
drain instead, hurrying the running requests to an end (`update(hurry=...)`). Updates of either
kind never overlap; the gate's step (what /health reports and new requests are admitted
under) becomes the new step once the swap succeeded. A request admitted just before an
in-flight swap may still be prefilled after it: the builtin server answers the step its
first tokens were sampled under (`builtin/app.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from prime_rl.utils.errors import UserError

HURRY_S = 0.05  # how often a draining update that hurries (`update(hurry=...)`) calls it again


class GateTimeout(Exception):
    """A request or an update waited longer than the gate's timeout."""


class WeightGate:
    def __init__(self, step: int = 0, timeout_s: float = 600.0):
        self.step = step
        self.timeout_s = timeout_s
        self._active = 0
        self._updating = False  # an update runs (the next one waits)
        self._holding = False  # ... and it is a draining one (new requests wait)
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
            await self._wait(lambda: not self._holding, "a weight update to finish")
            self._active += 1
            step = self.step
        try:
            yield step
        finally:
            async with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @asynccontextmanager
    async def update(self, new_step: int, drain: bool = True,
                     hurry: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
        """One update at a time; with `drain`, hold new requests and drain admitted ones (calling `hurry()` at
        once and every HURRY_S while some run: vLLM's abort, `vllm/abort.py`; if it fails, so does the update). The
        body swaps the weights; the step becomes `new_step` only if the body succeeds."""
        async with self._cond:
            await self._wait(lambda: not self._updating, "another weight update to finish")
            if not drain and new_step < self.step:
                raise UserError(f"an in-flight weight update cannot go back from step {self.step} to {new_step} "
                                "(the running requests' tokens would record a decreasing step): drain instead")
            self._updating = True
            self._holding = drain
            try:
                if drain:
                    await self._drain(hurry)
            except BaseException:
                self._updating = self._holding = False
                self._cond.notify_all()
                raise
        try:
            yield
            self.step = new_step
        finally:
            async with self._cond:
                self._updating = self._holding = False
                self._cond.notify_all()

    async def _drain(self, hurry: Callable[[], Awaitable[None]] | None) -> None:
        """Wait, holding the condition's lock (waiting releases it), until no admitted request runs; with `hurry`,
        call it first and again every HURRY_S (under the lock: a request that ends waits for it to return, so it is
        never interrupted half-way) until then, or until the gate's timeout."""
        if hurry is None:
            return await self._wait(lambda: self._active == 0, "in-flight requests to finish")
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while self._active > 0:
            if asyncio.get_running_loop().time() > deadline:
                raise GateTimeout(f"timed out after {self.timeout_s:.0f}s waiting for in-flight requests to finish")
            await hurry()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cond.wait_for(lambda: self._active == 0), HURRY_S)

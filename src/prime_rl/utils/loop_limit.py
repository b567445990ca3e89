"""`LoopLimit(n)`: at most n holders at once, in whichever event loop is running. An `asyncio.Semaphore` belongs to
the first loop that waits on it, and an object built once at config time (a reward function, a sandbox) may be used
from several loops in turn (`asyncio.run` per evaluation, per test): each loop gets a semaphore of its own."""

from __future__ import annotations

import asyncio
import weakref


class LoopLimit:
    def __init__(self, n: int):
        self.n = n
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
            weakref.WeakKeyDictionary()

    def __call__(self) -> asyncio.Semaphore:
        """The running loop's semaphore (`async with limit():`)."""
        loop = asyncio.get_running_loop()
        if loop not in self._by_loop:
            self._by_loop[loop] = asyncio.Semaphore(self.n)
        return self._by_loop[loop]

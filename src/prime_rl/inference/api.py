"""The API of docs/inference.md for a backend that serves its own HTTP app: the server's part, over the shared layer
`openai_api/` (errors, parsing, limits, the answers' shapes, which the orchestrator's agent gateway uses too).

A backend's app (the builtin one, `builtin/app.py`; the contract suite's toy, `tests/inference/toy_backend.py`) is
`server_app(title, access)` (`openai_api.http_api.json_app` with this server's `GateTimeout`: a request that waited
past `update_timeout_s` answers 503) plus its two generate routes (made with `openai_api.http_api`'s `parse`,
`check_model`, `completion_limits`, `chat_choice`/`completion_choice` and `answer`) plus `add_service_routes(...)`:
`GET /health` (no key; the served step), `GET /v1/models`, `POST /update_weights` (the shared flow,
`update.update_weights`, with the backend's `WeightLoader`) and `POST /reset`.

The vLLM backend is vLLM's own app with a middleware (`vllm/middleware.py`): it uses `guard` and `update` directly
and stamps vLLM's answers (`weight_step`, `token_weight_steps`, `prompt_token_ids`) to the same shapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prime_rl.inference import update as update_flow
from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.openapi import typed_route
from prime_rl.inference.update import WeightLoader
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.http_api import error_response, json_app, model_card, parse
from prime_rl.openai_api.protocol import ResetRequest, UpdateWeightsRequest


def server_app(title: str, access: AccessPolicy) -> FastAPI:
    """`json_app` with the server's own error: a request that waited for a weight update past `update_timeout_s`
    (`gate.GateTimeout`) answers 503."""
    return json_app(title, access, {GateTimeout: 503})


def add_service_routes(app: FastAPI, *, served_model: str, context_len: int, gate: WeightGate, loader: WeightLoader,
                       weight_roots: tuple[Path, ...], reset_caches: Callable[[], None],
                       alive: Callable[[], bool] = lambda: True) -> None:
    """`GET /health` (200 with the served step while `alive()`, else 503), `GET /v1/models`, `POST /update_weights`
    (`update.update_weights` with `loader`, from under `weight_roots`) and `POST /reset` (`reset_caches()`, in a
    thread)."""

    @app.get("/health", **typed_route())
    async def health():
        if not alive():
            return error_response(503, "the engine thread stopped")
        return {"status": "ok", "weight_step": gate.step}

    @app.get("/v1/models", **typed_route())
    async def models():
        return model_card(served_model, context_len)

    @app.post("/update_weights", **typed_route(UpdateWeightsRequest))
    async def update_weights(request: Request):
        body: UpdateWeightsRequest = await parse(request, UpdateWeightsRequest)
        status, payload = await update_flow.update_weights(body, loader, weight_roots, gate)
        return JSONResponse(payload, status_code=status)

    @app.post("/reset", **typed_route(ResetRequest))
    async def reset(request: Request):
        await parse(request, ResetRequest)
        await asyncio.to_thread(reset_caches)
        return {"status": "ok"}

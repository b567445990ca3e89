"""The builtin server's OpenAPI document (`/openapi.json`): every route's request body and error answers.

The handlers take the raw request, so that bodies are parsed strictly and off the event loop
(`protocol.parse_json`, then the model): FastAPI therefore cannot see their models on its own.
`typed_route(model)` declares a route's body model (and `ERRORS`, the one error shape) for the document,
and `document(app, models)` puts the models' JSON schemas under `components/schemas`, so clients and
fuzzers see the API as it is validated.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from prime_rl.openai_api.protocol import COMPLETION_MARK, TOKEN_ID_MARK

SCHEMAS = "#/components/schemas/{model}"


class ErrorDetail(BaseModel):
    message: str
    """One line naming the problem."""
    type: str
    """The status as a name, e.g. BadRequestError."""
    code: int
    """The HTTP status."""


class ErrorBody(BaseModel):
    """The body of every non-2xx answer (`guard.error_payload`)."""

    error: ErrorDetail


ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": meaning}
    for status, meaning in {
        400: "malformed or invalid body, beyond the context or the token budget, a refused weight update",
        401: "missing or wrong API key",
        403: "a weight path outside the allowed directories, or an admin request whose Host is not this server",
        404: "unknown model",
        413: "a body above max_request_bytes",
        415: "an admin request that is not application/json",
        500: "the engine failed on this request",
        503: "a weight update or a request waited longer than update_timeout_s, or the engine stopped",
    }.items()
}


def typed_route(model: type[BaseModel] | None = None) -> dict[str, Any]:
    """Keyword arguments of a route decorator: its error answers, and its JSON body `model` (required)."""
    route: dict[str, Any] = {"responses": ERRORS}
    if model is not None:
        schema = {"$ref": SCHEMAS.format(model=model.__name__)}
        route["openapi_extra"] = {
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}
        }
    return route


def document(app: FastAPI, models: list[type[BaseModel]], vocab: int, context_len: int, tool_calls: bool) -> None:
    """Make `app.openapi()` FastAPI's document plus the JSON schemas of `models` (and the models they use), with
    what this server's model bounds: every token id (`protocol.TokenId`) below `vocab`, `max_tokens` below
    `context_len`, messages without `tool_calls` unless the chat template renders them (`tool_calls`); and the
    bearer key every route but /health takes. What depends on the prompt's length (prompt + max_tokens within the
    context, prompts x n x max_tokens within `max_request_tokens`) no schema can say: a request that breaks it is
    schema-valid and still a 400."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                model_schema = model.model_json_schema(ref_template=SCHEMAS)
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
            bound_marked(components, {TOKEN_ID_MARK: vocab - 1, COMPLETION_MARK: context_len - 1})
            if not tool_calls and "ChatMessage" in components:
                no_calls(components["ChatMessage"])
            schema["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
            for path, operations in schema["paths"].items():
                for operation in operations.values():
                    operation["security"] = [] if path == "/health" else [{"apiKey": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def bound_marked(node: Any, maxima: dict[str, int]) -> None:
    """Give every schema carrying a mark of `maxima` (`protocol.TOKEN_ID_MARK`: below the vocabulary,
    `protocol.COMPLETION_MARK`: below the context) that maximum, and drop the mark; in place."""
    if isinstance(node, dict):
        for mark, maximum in maxima.items():
            if node.pop(mark, False):
                node["maximum"] = maximum
        for child in node.values():
            bound_marked(child, maxima)
    elif isinstance(node, list):
        for child in node:
            bound_marked(child, maxima)


def no_calls(message: dict[str, Any]) -> None:
    """A ChatMessage schema, in place, for a server whose chat template drops tool calls (the builtin app refuses a
    message with them): `tool_calls` absent, null or empty, so `content` is always text."""
    message["properties"]["tool_calls"] = {"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}
    message.pop("anyOf", None)
    message["properties"]["content"] = {"type": "string"}
    message.setdefault("required", []).append("content")

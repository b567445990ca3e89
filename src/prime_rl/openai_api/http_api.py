"""The OpenAI-compatible HTTP API written once, for the inference server's backends (`inference/api.py` composes a
backend's app from it) and the orchestrator's agent gateway (`rollouts/agents/gateway.py`), so both answer alike:

- **Errors.** `json_app` puts an app behind `guard.RequestGuard` (API key 401, admin Host 403 and Content-Type 415,
  body cap 413) and answers every error as `{"error": {"message", "type", "code"}}` (`guard.error_payload`): an
  `HTTPError(status, message)` a handler raises, a request validation error (400), the framework's own 404/405, an
  exception the app names in `statuses`, and any other exception (500).
- **Requests.** `parse` reads a body strictly (`protocol.parse_json`) into a request model, off the event loop (400
  naming the first problem); `check_model` answers 404 for another model; `context_room` and `completion_limits`
  give each prompt's `max_tokens` (unset: the rest of the context) and refuse, before anything is generated, a prompt
  that fills the context, prompt + `max_tokens` beyond it (`protocol.context_overflow`) and a request past
  `max_request_tokens` (`protocol.budget_overflow`), all 400.
- **Answers**, in vLLM's shapes: `chat_choice` and `completion_choice` make a choice of a `protocol.Completion` (its
  `token_ids`, `token_weight_steps` one per token id, `finish_reason`, logprobs: chat `logprobs.content[]` with
  `token`, `logprob`, `bytes`, `top_logprobs`; completions `tokens`, `token_logprobs`, `top_logprobs`,
  `text_offset`), with each token's text from `token_texts` (decoded once per server); `chat_message` is the
  assistant message with its tool calls parsed; `answer` is the envelope with the top-level `weight_step`,
  `prompt_token_ids` and `usage`; `model_card` the answer of `GET /v1/models`.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prime_rl.chat.tool_calls import parse_tool_calls
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.guard import RequestGuard, error_payload
from prime_rl.openai_api.protocol import (
    Completion,
    SamplingFields,
    budget_overflow,
    context_filled,
    context_overflow,
    parse_json,
)

TokenTexts = Callable[[int], tuple[str, tuple[int, ...]]]
"""A token id's (text, UTF-8 bytes), as the logprobs show it (`token_texts`)."""


class HTTPError(Exception):
    """Raised in a route: the request is answered `status` with `error_payload(status, message)`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_payload(status, message), status_code=status, headers=headers)


def validation_message(exc: ValidationError | RequestValidationError) -> str:
    """One line naming a body's first invalid field."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return f"invalid request: {where + ': ' if where else ''}{msg}"


def json_app(title: str, access: AccessPolicy, statuses: Mapping[type[Exception], int] | None = None) -> FastAPI:
    """A FastAPI app behind `RequestGuard(access)` whose every error answer is `error_payload` JSON; `statuses`: the
    status an exception of the app's own answers with (its message the error's), e.g. the server's `GateTimeout`."""
    app = FastAPI(title=title)
    app.add_middleware(RequestGuard, access=access)

    @app.exception_handler(HTTPError)
    async def _http_error(_: Request, exc: HTTPError):
        return error_response(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError):
        return error_response(400, validation_message(exc))

    for kind, status in (statuses or {}).items():
        app.add_exception_handler(kind, lambda _request, exc, status=status: error_response(status, str(exc)))

    @app.exception_handler(StarletteHTTPException)
    async def _framework_error(_: Request, exc: StarletteHTTPException):  # unknown route (404), method (405)
        return error_response(exc.status_code, str(exc.detail), exc.headers)  # a 405 keeps its Allow header

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception):  # logged with its traceback by the server
        return error_response(500, f"internal server error ({type(exc).__name__})")

    return app


def decode_body(raw: bytes, model_cls: type[BaseModel]) -> Any:
    """Strict JSON (`protocol.parse_json`) validated into `model_cls`; HTTPError(400) naming the problem."""
    try:
        body = parse_json(raw)
    except ValueError as exc:
        raise HTTPError(400, str(exc)) from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the JSON body must be an object")
    try:
        return model_cls.model_validate(body)
    except ValidationError as exc:
        raise HTTPError(400, validation_message(exc)) from None


async def parse(request: Request, model_cls: type[BaseModel]) -> Any:
    """`decode_body` of the request's body, in a worker thread (a large body never stalls the event loop)."""
    return await asyncio.to_thread(decode_body, await request.body(), model_cls)


def check_model(body: SamplingFields, served_model: str) -> None:
    """404 unless the request names no model or the served one."""
    if body.model is not None and body.model != served_model:
        raise HTTPError(404, f"model '{body.model}' does not exist (this server serves '{served_model}')")


def completion_limits(prompt_lengths: list[int], body: SamplingFields, context_len: int, budget: int) -> list[int]:
    """Each prompt's `max_tokens` (unset: the rest of the context); HTTPError(400) for a prompt that fills the
    context, prompt + max_tokens beyond it, or prompts x n x max_tokens past `budget` (`max_request_tokens`). Every
    prompt is checked before anything is generated."""
    limits = []
    for length in prompt_lengths:
        max_tokens = body.max_tokens if body.max_tokens is not None else context_len - length
        if max_tokens < 1:
            raise HTTPError(400, context_filled(length, context_len))
        overflow = context_overflow(length, max_tokens, context_len)
        if overflow:
            raise HTTPError(400, overflow)
        limits.append(max_tokens)
    over_budget = budget_overflow(len(prompt_lengths), body.n, max(limits), budget)
    if over_budget:
        raise HTTPError(400, over_budget)
    return limits


def token_texts(decode: Callable[[list[int]], str]) -> TokenTexts:
    """A token id's (text, UTF-8 bytes) by `decode`, decoded once per server (a token's text never changes)."""

    @functools.lru_cache(maxsize=1 << 17)
    def entry(token_id: int) -> tuple[str, tuple[int, ...]]:
        text = decode([token_id])
        return text, tuple(text.encode())

    return entry


def chat_message(completion: Completion, with_tools: bool) -> dict:
    """A chat choice's `message` and `finish_reason`. With `with_tools` (tools given, tool_choice not "none"), a
    text whose `<tool_call>` blocks all parse becomes `tool_calls` (OpenAI format) and `content` the rest (null
    when empty), and a choice with calls that stopped on its own finishes with "tool_calls"; a text with a
    malformed block stays whole in `content` (as vLLM's hermes parser does). The token ids and logprobs are the
    sampled ones either way."""
    turn = parse_tool_calls(completion.text) if with_tools else None
    if turn is None or not turn.calls or turn.malformed:
        return {"message": {"role": "assistant", "content": completion.text}, "finish_reason": completion.finish_reason}
    message = {"role": "assistant", "content": turn.content or None, "tool_calls": [c.openai() for c in turn.calls]}
    finish = "tool_calls" if completion.finish_reason == "stop" else completion.finish_reason
    return {"message": message, "finish_reason": finish}


def chat_choice(index: int, completion: Completion, texts: TokenTexts, with_tools: bool = False) -> dict:
    """Choice `index` of a chat answer (`chat_message` for the message)."""
    entries = [{"token": text, "logprob": lp, "bytes": raw, "top_logprobs": []}
               for (text, raw), lp in zip(map(texts, completion.token_ids), completion.logprobs, strict=True)]
    return {"index": index, **chat_message(completion, with_tools), "token_ids": completion.token_ids,
            "token_weight_steps": completion.weight_steps, "logprobs": {"content": entries}}


def completion_choice(index: int, completion: Completion, texts: TokenTexts, prompt_ids: list[int]) -> dict:
    """Choice `index` of a completions answer, with its prompt's `prompt_token_ids` (where vLLM puts them)."""
    tokens = [texts(t)[0] for t in completion.token_ids]
    offsets = [0, *itertools.accumulate(len(s) for s in tokens[:-1])] if tokens else []
    return {"index": index, "text": completion.text, "token_ids": completion.token_ids,
            "token_weight_steps": completion.weight_steps, "prompt_token_ids": prompt_ids,
            "finish_reason": completion.finish_reason,
            "logprobs": {"tokens": tokens, "token_logprobs": completion.logprobs, "top_logprobs": None,
                         "text_offset": offsets}}


def answer(kind: str, served_model: str, prompt_ids: list[int], step: int, choices: list[dict],
           prompt_tokens: int | None = None) -> dict:
    """The answer envelope: `kind` "chat.completion" or "text_completion", the top-level `prompt_token_ids` (a
    completions batch: the first prompt's) and `weight_step` (the step the request was served under), `usage`
    (`prompt_tokens`: all prompts', default `prompt_ids`')."""
    completion_tokens = sum(len(c["token_ids"]) for c in choices)
    prompt_tokens = len(prompt_ids) if prompt_tokens is None else prompt_tokens
    return {
        "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": served_model,
        "choices": choices,
        "prompt_token_ids": prompt_ids,
        "weight_step": step,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def context_room(prompt_tokens: int, context_len: int, what: str = "prompt") -> int:
    """The tokens a completion may take after a prompt of `prompt_tokens`; HTTPError(400) when the prompt (`what`: the
    agent gateway's "conversation") fills the context."""
    if prompt_tokens >= context_len:
        raise HTTPError(400, context_filled(prompt_tokens, context_len, what))
    return context_len - prompt_tokens


def model_card(served_model: str, context_len: int) -> dict:
    """`GET /v1/models`' answer: the one model served, with its context length (vLLM's `max_model_len`)."""
    return {"object": "list", "data": [{"id": served_model, "object": "model", "owned_by": "prime-rl",
                                        "max_model_len": context_len}]}

"""The builtin backend's HTTP API (FastAPI), in the response shapes of vLLM's OpenAI server.

Every completion response has top-level `prompt_token_ids` and `weight_step` (the step
its first tokens were sampled under: the engine's step when it prefilled the prompt);
every choice has `token_ids`, `token_weight_steps` (the step each token was sampled
under, one per token id), `finish_reason` and logprobs (chat: `logprobs.content[]`,
completions: `logprobs.token_logprobs`); a token's text is decoded once per server
(`token_entry`). A completions request with `prompt_logprobs: 0` (the teacher's scoring call)
also gets vLLM's per-choice `prompt_logprobs`, computed from the same prefill (engine.py). Every error, the framework's own 404/405/500 included, is a JSON
`{"error": {...}}`. Requests pass `guard.RequestGuard` first (API key, admin checks, body
cap). Parsing, validation, chat templating and tokenization run in worker threads, so a
large body never stalls the event loop (and `/health`).

`POST /update_weights` reads and checks the new weights before it touches the gate, then
swaps them through it (`gate.py`): draining by default, so every token of a response
carries its `weight_step`; with `"in_flight": true` between two decode iterations while
requests keep running, so a choice's later tokens may carry the new step.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from prime_rl.inference.builtin.engine import Completion, Engine, SamplingParams
from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.guard import RequestGuard, error_payload
from prime_rl.inference.policy import Policy
from prime_rl.inference.protocol import (
    ChatRequest,
    CompletionRequest,
    SamplingFields,
    UpdateWeightsRequest,
    context_overflow,
    parse_json,
)
from prime_rl.inference.transfer import TransferReceiver
from prime_rl.inference.update import update_weights as serve_update
from prime_rl.utils.chat_tokens import render_chat, renders_tool_calls
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger
from prime_rl.utils.tool_calls import parse_tool_calls
from prime_rl.utils.weight_transfer import is_marker_dir

log = get_logger("inference")


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def longest_token_chars(tokenizer) -> int:
    """The most characters of text one token can stand for: the longest token string of the vocabulary, added
    tokens included (a byte-level BPE token's string has a character per byte, so at least as many as the text it
    covers; a SentencePiece or WordPiece token's string is its text, plus a marker)."""
    return max(1, max(map(len, tokenizer.get_vocab())))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_payload(status, message), status_code=status, headers=headers)


def _validation_message(exc: ValidationError | RequestValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return f"invalid request: {where + ': ' if where else ''}{msg}"


def decode_body(raw: bytes, model_cls):
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
        raise HTTPError(400, _validation_message(exc)) from None


async def _parse(request: Request, model_cls):
    return await asyncio.to_thread(decode_body, await request.body(), model_cls)


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


class BuiltinLoader:
    """The builtin engine's side of `/update_weights` (`inference/update.py`): weights staged off the engine thread
    (`Engine.stage_weights`, or the newest taken from the transfer group for a marker), applied between two loop
    iterations; it can swap them while requests run (`in_flight`)."""

    in_flight = True

    def __init__(self, engine: Engine, receiver: TransferReceiver | None, timeout_s: float):
        self.engine, self.receiver, self.timeout_s = engine, receiver, timeout_s

    async def stage(self, path, step: int):
        if not is_marker_dir(path):
            return step, await asyncio.to_thread(self.engine.stage_weights, str(path))
        if self.receiver is None:  # the weights came over the transfer group: the newest staged, step >= asked
            raise UserError(f"{path} marks weights sent over torch.distributed, but this server is in no weight "
                            "transfer group (weight_transfer.mode)")
        return await asyncio.to_thread(self.receiver.take, step, self.timeout_s)

    async def apply(self, staged, step: int) -> None:
        await asyncio.to_thread(self.engine.apply_weights, staged, step)


def create_app(engine: Engine, served_model: str, gate: WeightGate, policy: Policy | None = None,
               receiver: TransferReceiver | None = None) -> FastAPI:
    policy = policy or Policy()
    app = FastAPI(title="prime-rl builtin inference")
    app.add_middleware(RequestGuard, policy=policy)
    tokenizer = engine.tokenizer
    vocab_size = engine.vocab  # what it samples is what it accepts back as a prompt
    longest_token = longest_token_chars(tokenizer)
    tool_calls_rendered = tokenizer.chat_template is not None and renders_tool_calls(tokenizer)

    @app.exception_handler(HTTPError)
    async def _http_error(_: Request, exc: HTTPError):
        return _error(exc.status, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError):
        return _error(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _framework_error(_: Request, exc: StarletteHTTPException):  # unknown route (404), method (405)
        return _error(exc.status_code, str(exc.detail), exc.headers)  # a 405 keeps its Allow header

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception):  # logged with its traceback by the server
        return _error(500, f"internal server error ({type(exc).__name__})")

    def check_model(body: SamplingFields) -> None:
        if body.model is not None and body.model != served_model:
            raise HTTPError(404, f"model '{body.model}' does not exist (this server serves '{served_model}')")

    async def generate(prompt_ids: list[int], body: SamplingFields) -> tuple[list[Completion], int]:
        (completions,), step = await generate_many([prompt_ids], body)
        return completions, step

    async def generate_many(prompts: list[list[int]], body: SamplingFields) -> tuple[list[list[Completion]], int]:
        """Each prompt's `n` completions, all submitted at once under one admission of the gate (so the engine
        prefills them together), and the oldest step their first tokens were sampled under. Any prompt that
        fails fails the whole request, as on vLLM."""
        try:
            stops = body.stop_strings
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None
        params = []
        for prompt_ids in prompts:
            max_tokens = body.max_tokens if body.max_tokens is not None else engine.context_len - len(prompt_ids)
            if max_tokens < 1:
                raise HTTPError(400, f"the prompt ({len(prompt_ids)} tokens) fills the context length "
                                     f"{engine.context_len}")
            overflow = context_overflow(len(prompt_ids), max_tokens, engine.context_len)
            if overflow:  # checked for every prompt before any is submitted
                raise HTTPError(400, overflow)
            params.append(SamplingParams(max_tokens, body.temperature, body.top_p, body.top_k, body.min_p, stops,
                                         body.seed, prompt_logprobs=body.prompt_logprobs is not None))
        try:
            async with gate.request():
                futures = [engine.submit(prompt_ids, p, body.n) for prompt_ids, p in zip(prompts, params, strict=True)]
                answers = await asyncio.gather(*map(asyncio.wrap_future, futures))
        except UserError as exc:
            raise HTTPError(400, str(exc)) from None
        except GateTimeout as exc:
            raise HTTPError(503, str(exc)) from None
        # A request's choices were prefilled together, so their first tokens share a step: the one the
        # gate admitted the request under, unless an in-flight update landed before its prefill.
        return answers, min(completions[0].weight_steps[0] for completions in answers)

    def envelope(kind: str, prompt_ids: list[int], step: int, choices: list[dict], completions,
                 prompt_tokens: int | None = None) -> dict:
        completion_tokens = sum(len(c.token_ids) for c in completions)
        prompt_tokens = len(prompt_ids) if prompt_tokens is None else prompt_tokens
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": served_model,
            "choices": choices,
            "prompt_token_ids": prompt_ids,
            "weight_step": step,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @functools.lru_cache(maxsize=1 << 17)  # a token's text never changes: decode each id once
    def token_entry(token_id: int) -> tuple[str, tuple[int, ...]]:
        """(text, UTF-8 bytes) of one token, as the logprobs of both routes show it."""
        text = tokenizer.decode([token_id])
        return text, tuple(text.encode())

    def encode(text: str) -> list[int]:
        """Token ids of `text`. A text that cannot fit the context is refused before it is tokenized (a 4 MiB
        prompt took 20 s and 1.6 GB to tokenize only to be refused): a token covers at most `longest_token`
        characters, so a text of more than context * longest_token characters has more tokens than fit."""
        if len(text) > engine.context_len * longest_token:
            raise HTTPError(400, f"the prompt ({len(text)} characters, so at least "
                                 f"{-(-len(text) // longest_token)} tokens) exceeds the context length "
                                 f"{engine.context_len}")
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def chat_prompt(messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None) -> list[int]:
        if not tool_calls_rendered and any(m.get("tool_calls") for m in messages):
            raise HTTPError(400, "the model's chat template does not render assistant tool_calls (e.g. Llama 3's): "
                                 "the model would see the history without its calls")
        try:
            text = render_chat(tokenizer, messages, tools, True, template_kwargs)
        except Exception as exc:  # a template error is the request's fault
            raise HTTPError(400, f"cannot apply the chat template: {exc}") from None
        return encode(text)

    def token_prompt(ids: list[int]) -> list[int]:
        if any(not 0 <= t < vocab_size for t in ids):
            raise HTTPError(400, f"prompt token ids must be in [0, {vocab_size})")
        return list(ids)

    @app.get("/health")
    async def health():
        if not engine.alive:
            return _error(503, "the engine thread stopped")
        return {"status": "ok", "weight_step": gate.step}

    @app.get("/v1/models")
    async def models():
        card = {"id": served_model, "object": "model", "owned_by": "prime-rl", "max_model_len": engine.context_len}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body: ChatRequest = await _parse(request, ChatRequest)
        check_model(body)
        messages = [m.template_dict() for m in body.messages]
        prompt_ids = await asyncio.to_thread(chat_prompt, messages, body.template_tools(), body.chat_template_kwargs)
        completions, step = await generate(prompt_ids, body)
        choices = [
            {
                "index": i,
                **chat_message(c, body.parses_tool_calls),
                "token_ids": c.token_ids,
                "token_weight_steps": c.weight_steps,
                "logprobs": {
                    "content": [
                        {"token": text, "logprob": lp, "bytes": raw, "top_logprobs": []}
                        for (text, raw), lp in zip(map(token_entry, c.token_ids), c.logprobs, strict=True)
                    ]
                },
            }
            for i, c in enumerate(completions)
        ]
        return JSONResponse(envelope("chat.completion", prompt_ids, step, choices, completions))

    @app.post("/v1/completions")
    async def complete(request: Request):
        body: CompletionRequest = await _parse(request, CompletionRequest)
        check_model(body)
        if body.batched:
            prompts = await asyncio.to_thread(lambda: [token_prompt(p) for p in body.prompt])
        else:
            prepare = encode if isinstance(body.prompt, str) else token_prompt
            prompts = [await asyncio.to_thread(prepare, body.prompt)]
        answers, step = await generate_many(prompts, body)
        choices = await asyncio.to_thread(completion_choices, prompts, answers)
        completions = [c for completions in answers for c in completions]
        # vLLM's shape for a batch: each choice has its prompt's ids; the top level has the first prompt's
        return JSONResponse(envelope("text_completion", prompts[0], step, choices, completions,
                                     sum(map(len, prompts))))

    def completion_choices(prompts: list[list[int]], answers: list[list[Completion]]) -> list[dict]:
        """The choices of a completions answer: choice p * n + j is prompt p's completion j."""
        choices = []
        for prompt_ids, completions in zip(prompts, answers, strict=True):
            for c in completions:
                tokens = [token_entry(t)[0] for t in c.token_ids]
                offsets = [0, *itertools.accumulate(len(s) for s in tokens[:-1])] if tokens else []
                choices.append({
                    "index": len(choices),
                    "text": c.text,
                    "token_ids": c.token_ids,
                    "token_weight_steps": c.weight_steps,
                    "prompt_token_ids": prompt_ids,  # where vLLM puts it for completions
                    "finish_reason": c.finish_reason,
                    "logprobs": {"tokens": tokens, "token_logprobs": c.logprobs, "top_logprobs": None,
                                 "text_offset": offsets},
                })
                if c.prompt_logprobs is not None:  # vLLM's shape: None for the first token, then {id: entry}
                    choices[-1]["prompt_logprobs"] = [None] + [
                        {str(t): {"logprob": lp, "rank": rank, "decoded_token": token_entry(t)[0]}}
                        for t, (lp, rank) in zip(prompt_ids[1:], c.prompt_logprobs, strict=True)
                    ]
        return choices

    loader = BuiltinLoader(engine, receiver, gate.timeout_s)

    @app.post("/update_weights")
    async def update_weights(request: Request):
        body: UpdateWeightsRequest = await _parse(request, UpdateWeightsRequest)
        status, payload = await serve_update(body, loader, policy.weight_roots, gate)
        return JSONResponse(payload, status_code=status)

    @app.post("/reset")
    async def reset():
        await asyncio.to_thread(engine.reset)
        return {"status": "ok"}

    return app

"""The builtin backend's HTTP API (FastAPI), in the response shapes of vLLM's OpenAI server.

Built from the pieces every backend's app shares (`openai_api/http_api.py`: the guard, JSON errors, strict
parsing, the context and token-budget checks, the answer envelope and choices; `inference/api.py`: `/health`,
`/v1/models`, `/update_weights`, `/reset`); what is the builtin engine's own is here: chat templating and
tokenization, prompt token ids below the vocabulary, tool-call parsing, prompt logprobs, and its `WeightLoader`.

Every completion response has top-level `prompt_token_ids` and `weight_step` (the step
its first tokens were sampled under: the engine's step when it prefilled the prompt);
every choice has `token_ids`, `token_weight_steps` (the step each token was sampled
under, one per token id), `finish_reason` and logprobs (chat: `logprobs.content[]`,
completions: `logprobs.token_logprobs`); a token's text is decoded once per server
(`http_api.token_texts`). A completions request with `prompt_logprobs: 0` (the teacher's scoring call)
also gets vLLM's per-choice `prompt_logprobs`, computed from the same prefill (engine.py). Every error, the
framework's own 404/405/500 included, is a JSON `{"error": {...}}`. Requests pass `guard.RequestGuard` first (API
key, admin checks, body cap). Parsing, validation, chat templating and tokenization run in worker threads, so a
large body never stalls the event loop (and `/health`); a text that cannot fit the context is
refused before it is tokenized in full (`prompt_text.py`), and a request asking for more than
`max_request_tokens` completion tokens before anything is submitted (`protocol.budget_overflow`).

`/openapi.json` declares every route's request body (the models of `protocol.py`) and error shape
(`openapi.py`), though the handlers parse the raw body themselves.

`POST /update_weights` reads and checks the new weights before it touches the gate, then
swaps them through it (`gate.py`): draining by default, so every token of a response
carries its `weight_step`; with `"in_flight": true` between two decode iterations while
requests keep running, so a choice's later tokens may carry the new step.
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prime_rl.chat.template_tokens import render_chat, renders_tool_calls
from prime_rl.inference.api import add_service_routes, server_app
from prime_rl.inference.builtin.engine import Completion, Engine, SamplingParams
from prime_rl.inference.builtin.prompt_text import PromptText, PromptTooLong
from prime_rl.inference.gate import WeightGate
from prime_rl.inference.openapi import document, typed_route
from prime_rl.inference.transfer import TransferReceiver
from prime_rl.inference.weight_dirs import WeightDir
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.http_api import (
    HTTPError,
    answer,
    chat_choice,
    check_model,
    completion_choice,
    completion_limits,
    parse,
    token_texts,
)
from prime_rl.openai_api.protocol import (
    ChatRequest,
    CompletionRequest,
    ResetRequest,
    SamplingFields,
    UpdateWeightsRequest,
)
from prime_rl.utils.errors import UserError


class BuiltinLoader:
    """The builtin engine's side of `/update_weights` (`inference/update.py`): weights staged off the engine thread
    (`Engine.stage_weights`, or the newest taken from the transfer group for a marker), applied between two loop
    iterations; it can swap them while requests run (`in_flight`)."""

    in_flight = True

    def __init__(self, engine: Engine, receiver: TransferReceiver | None, timeout_s: float):
        self.engine, self.receiver, self.timeout_s = engine, receiver, timeout_s

    async def stage(self, weights: WeightDir, step: int):
        if not weights.is_marker:
            return step, await asyncio.to_thread(self.engine.stage_weights, weights)
        if self.receiver is None:  # the weights came over the transfer group: the newest staged, step >= asked
            raise UserError(f"{weights.path} marks weights sent over torch.distributed, but this server is in no "
                            "weight transfer group (weight_transfer.mode)")
        return await asyncio.to_thread(self.receiver.take, step, self.timeout_s)

    async def apply(self, staged, step: int) -> None:
        await asyncio.to_thread(self.engine.apply_weights, staged, step)


def create_app(engine: Engine, served_model: str, gate: WeightGate, access: AccessPolicy | None = None,
               receiver: TransferReceiver | None = None) -> FastAPI:
    access = access or AccessPolicy()
    app = server_app("prime-rl builtin inference", access)
    tokenizer = engine.tokenizer
    vocab_size = engine.vocab  # what it samples is what it accepts back as a prompt
    prompt_text = PromptText(tokenizer, engine.context_len)
    tool_calls_rendered = tokenizer.chat_template is not None and renders_tool_calls(tokenizer)
    texts = token_texts(tokenizer.decode)

    async def generate_many(prompts: list[list[int]], body: SamplingFields) -> tuple[list[list[Completion]], int]:
        """Each prompt's `n` completions, all submitted at once under one admission of the gate (so the engine
        prefills them together) as one owner of the engine's fair share, and the oldest step their first tokens
        were sampled under. Any prompt that fails fails the whole request, as on vLLM. A request past the token
        budget or the context is refused before any prompt is submitted (`api.completion_limits`)."""
        try:
            stops = body.stop_strings
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None
        limits = completion_limits([len(p) for p in prompts], body, engine.context_len, access.max_request_tokens)
        params = [SamplingParams(max_tokens, body.temperature, body.top_p, body.top_k, body.min_p, stops, body.seed,
                                 prompt_logprobs=body.prompt_logprobs is not None) for max_tokens in limits]
        owner = object()
        try:
            async with gate.request():  # a GateTimeout is a 503 (`api.server_app`)
                futures = [engine.submit(prompt_ids, p, body.n, owner) for prompt_ids, p in zip(prompts, params,
                                                                                               strict=True)]
                answers = await asyncio.gather(*map(asyncio.wrap_future, futures))
        except UserError as exc:
            raise HTTPError(400, str(exc)) from None
        # A request's choices were prefilled together, so their first tokens share a step: the one the
        # gate admitted the request under, unless an in-flight update landed before its prefill.
        return answers, min(completions[0].weight_steps[0] for completions in answers)

    def encode(text: str) -> list[int]:
        try:
            return prompt_text.encode(text)
        except PromptTooLong as exc:
            raise HTTPError(400, str(exc)) from None

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

    @app.post("/v1/chat/completions", **typed_route(ChatRequest))
    async def chat(request: Request):
        body: ChatRequest = await parse(request, ChatRequest)
        check_model(body, served_model)
        messages = [m.template_dict() for m in body.messages]
        prompt_ids = await asyncio.to_thread(chat_prompt, messages, body.template_tools(), body.chat_template_kwargs)
        (completions,), step = await generate_many([prompt_ids], body)
        choices = [chat_choice(i, c, texts, body.parses_tool_calls) for i, c in enumerate(completions)]
        return JSONResponse(answer("chat.completion", served_model, prompt_ids, step, choices))

    @app.post("/v1/completions", **typed_route(CompletionRequest))
    async def complete(request: Request):
        body: CompletionRequest = await parse(request, CompletionRequest)
        check_model(body, served_model)
        if body.batched:
            prompts = await asyncio.to_thread(lambda: [token_prompt(p) for p in body.prompt])
        else:
            prepare = encode if isinstance(body.prompt, str) else token_prompt
            prompts = [await asyncio.to_thread(prepare, body.prompt)]
        answers, step = await generate_many(prompts, body)
        choices = await asyncio.to_thread(completion_choices, prompts, answers)
        # vLLM's shape for a batch: each choice has its prompt's ids; the top level has the first prompt's
        return JSONResponse(answer("text_completion", served_model, prompts[0], step, choices, sum(map(len, prompts))))

    def completion_choices(prompts: list[list[int]], answers: list[list[Completion]]) -> list[dict]:
        """The choices of a completions answer: choice p * n + j is prompt p's completion j."""
        choices = []
        for prompt_ids, completions in zip(prompts, answers, strict=True):
            for c in completions:
                choices.append(completion_choice(len(choices), c, texts, prompt_ids))
                if c.prompt_logprobs is not None:  # vLLM's shape: None for the first token, then {id: entry}
                    choices[-1]["prompt_logprobs"] = [None] + [
                        {str(t): {"logprob": lp, "rank": rank, "decoded_token": texts(t)[0]}}
                        for t, (lp, rank) in zip(prompt_ids[1:], c.prompt_logprobs, strict=True)
                    ]
        return choices

    add_service_routes(app, served_model=served_model, context_len=engine.context_len, gate=gate,
                       loader=BuiltinLoader(engine, receiver, gate.timeout_s), weight_roots=access.weight_roots,
                       reset_caches=lambda: engine.reset(), alive=lambda: engine.alive)
    document(app, [ChatRequest, CompletionRequest, ResetRequest, UpdateWeightsRequest], vocab_size,
             engine.context_len, tool_calls_rendered)
    return app

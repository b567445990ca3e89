"""A third inference backend in one module, the contract suite's proof that adding one takes one module and one
registration: importing it registers `ToyConfig` (`[inference.toy]`, no options) and `serve_toy` in `BACKENDS`.

Its engine is a stand-in: one token per character (the code point), every choice the completion `ANSWER` cut at
`max_tokens`, every token logprob `LOGPROB`. Everything else is the shared API (`openai_api/http_api.py`: the guard,
JSON errors, strict parsing, the context and budget checks, the answer shapes; `inference/api.py`: `/health`,
`/v1/models`, `/reset`, `/update_weights` with this module's `ToyLoader`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import uvicorn
from fastapi import FastAPI, Request

from prime_rl.configs.base import BaseConfig
from prime_rl.inference import api
from prime_rl.inference.config import BACKENDS, InferenceConfig
from prime_rl.inference.gate import WeightGate
from prime_rl.inference.weight_dirs import WeightDir
from prime_rl.openai_api import http_api
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.protocol import ChatRequest, Completion, CompletionRequest, SamplingFields

ANSWER, LOGPROB = "toy!", -0.5


@BACKENDS.config
class ToyConfig(BaseConfig):
    """The toy backend: a stand-in engine, no options."""

    name: ClassVar[str] = "toy"


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


@dataclass
class ToyEngine:
    """Answers `ANSWER` to every prompt under weight step `step`; keeps the prompts it was given."""

    step: int = 0
    prompts: list[list[int]] = field(default_factory=list)

    def generate(self, prompt_ids: list[int], max_tokens: int, n: int) -> list[Completion]:
        self.prompts.append(prompt_ids)
        ids = encode(ANSWER)[:max_tokens]
        finish = "stop" if len(ids) == len(ANSWER) else "length"
        return [Completion(ids, [LOGPROB] * len(ids), decode(ids), finish, [self.step] * len(ids)) for _ in range(n)]


@dataclass
class ToyLoader:
    """The toy's `WeightLoader`: nothing to read (a stand-in has no weights); it swaps only between requests."""

    engine: ToyEngine
    in_flight: ClassVar[bool] = False

    async def stage(self, weights: WeightDir, step: int) -> tuple[int, None]:
        return step, None

    async def apply(self, staged: None, step: int) -> None:
        self.engine.step = step


def create_app(engine: ToyEngine, served_model: str, context_len: int, gate: WeightGate,
               access: AccessPolicy) -> FastAPI:
    app = api.server_app("toy inference", access)
    texts = http_api.token_texts(decode)

    async def generate(prompts: list[list[int]], body: SamplingFields) -> tuple[list[list[Completion]], int]:
        limits = http_api.completion_limits([len(p) for p in prompts], body, context_len, access.max_request_tokens)
        async with gate.request() as step:
            return [engine.generate(p, limit, body.n) for p, limit in zip(prompts, limits, strict=True)], step

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body: ChatRequest = await http_api.parse(request, ChatRequest)
        http_api.check_model(body, served_model)
        prompt = encode("".join(f"{m.role}: {m.content or ''}\n" for m in body.messages))
        (completions,), step = await generate([prompt], body)
        choices = [http_api.chat_choice(i, c, texts) for i, c in enumerate(completions)]
        return http_api.answer("chat.completion", served_model, prompt, step, choices)

    @app.post("/v1/completions")
    async def complete(request: Request):
        body: CompletionRequest = await http_api.parse(request, CompletionRequest)
        http_api.check_model(body, served_model)
        prompts = body.prompt if body.batched else [encode(body.prompt) if isinstance(body.prompt, str)
                                                    else body.prompt]
        answers, step = await generate(prompts, body)
        pairs = [(p, c) for p, completions in zip(prompts, answers, strict=True) for c in completions]
        choices = [http_api.completion_choice(i, c, texts, p) for i, (p, c) in enumerate(pairs)]
        return http_api.answer("text_completion", served_model, prompts[0], step, choices, sum(map(len, prompts)))

    api.add_service_routes(app, served_model=served_model, context_len=context_len, gate=gate,
                           loader=ToyLoader(engine), weight_roots=access.weight_roots, reset_caches=lambda: None)
    return app


@BACKENDS.implements(ToyConfig)
def serve_toy(config: InferenceConfig) -> None:
    """Serve the toy backend on `config.host:config.port` (the contract suite stands it up in-process instead)."""
    app = create_app(ToyEngine(), config.model.name, config.seq_len,
                     WeightGate(timeout_s=config.update_timeout_s), AccessPolicy.from_config(config))
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning")

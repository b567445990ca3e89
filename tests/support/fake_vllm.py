"""A stand-in for vLLM's OpenAI app behind prime-rl's middleware, so that the vLLM glue is tested without vLLM.

`fake_vllm_app(engine_client)` is a FastAPI app with `app.state.engine_client` (what the middleware calls for weight
updates and `/reset`: `FakeEngineClient` records the calls) and `PrimeRLMiddleware` added, as `vllm --middleware`
adds it. Its generate routes answer as vLLM 0.32 does with `return_token_ids` and `logprobs`: one token per character
(the token id is the code point), every choice the completion `ANSWER` cut at `max_tokens`, `n` choices per prompt,
a completions choice with its prompt's `prompt_token_ids` (chat: top-level), logprobs in the OpenAI shapes, `usage`
counting every prompt; `"stream": true` gets an event stream. `weight_dir` writes a checkpoint for it. It does
not validate requests or check the model name: vLLM does that itself (tested against vLLM: `-m vllm`). The
requests that reached it are in `app.state.generated`; while the returned event is cleared, generate requests
wait.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from safetensors.torch import save_file

from prime_rl.inference.vllm.middleware import PrimeRLMiddleware

ANSWER = "ok"
LOGPROB = -0.5


class FakeEngineClient:
    """vLLM's engine client as the middleware uses it: `collective_rpc` and `reset_prefix_cache`, recorded."""

    def __init__(self, fail: bool = False):
        self.calls: list[tuple] = []
        self.fail = fail

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, args))
        if self.fail:
            raise RuntimeError("shape mismatch")

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", ()))


def token_ids(text: str) -> list[int]:
    """The stand-in's tokenizer: one token per character."""
    return [ord(c) for c in text]


def prompts_of(body: dict) -> list[list[int]]:
    """A generate request's prompts as token ids (chat: the messages' contents; a batch: each prompt)."""
    if "messages" in body:
        return [token_ids("".join(str(m.get("content") or "") for m in body["messages"]))]
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
        return [token_ids(p) if isinstance(p, str) else p for p in prompt]
    return [token_ids(prompt) if isinstance(prompt, str) else prompt]


def sampled(body: dict) -> tuple[list[int], str]:
    """The completion's token ids and finish reason: ANSWER, cut at max_tokens."""
    limit = body.get("max_tokens") or body.get("max_completion_tokens") or len(ANSWER)
    ids = token_ids(ANSWER)[:limit]
    return ids, "stop" if len(ids) == len(ANSWER) else "length"


def chat_choice(index: int, ids: list[int], finish: str) -> dict:
    content = [{"token": chr(t), "logprob": LOGPROB, "bytes": list(chr(t).encode()), "top_logprobs": []} for t in ids]
    return {"index": index, "message": {"role": "assistant", "content": "".join(map(chr, ids))},
            "token_ids": ids, "finish_reason": finish, "logprobs": {"content": content}}


def completion_choice(index: int, ids: list[int], finish: str, prompt_ids: list[int]) -> dict:
    tokens = [chr(t) for t in ids]
    logprobs = {"tokens": tokens, "token_logprobs": [LOGPROB] * len(ids), "top_logprobs": None,
                "text_offset": list(range(len(ids)))}
    return {"index": index, "text": "".join(tokens), "token_ids": ids, "prompt_token_ids": prompt_ids,
            "finish_reason": finish, "logprobs": logprobs}


def fake_vllm_app(engine_client, served_model: str = "served") -> tuple[FastAPI, asyncio.Event]:
    """The stand-in app (module docstring), serving `served_model` (`--served-model-name`), and the event generate
    requests wait for (set)."""
    app = FastAPI()
    app.state.engine_client = engine_client
    app.state.generated = []
    release = asyncio.Event()
    release.set()

    async def generate(request: Request, chat: bool):
        body = await request.json()  # the middleware read it first: the app must still get it whole
        app.state.generated.append(body)
        await release.wait()
        if body.get("stream"):
            return StreamingResponse(iter([b"data: {}\n\n"]), media_type="text/event-stream")
        prompts, (ids, finish), n = prompts_of(body), sampled(body), body.get("n", 1)
        indices = itertools.count()
        if chat:
            choices = [chat_choice(next(indices), ids, finish) for _ in range(n)]
        else:
            choices = [completion_choice(next(indices), ids, finish, p) for p in prompts for _ in range(n)]
        usage = {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": len(ids) * len(choices)}
        answer = {"object": "chat.completion" if chat else "text_completion", "model": body.get("model"),
                  "choices": choices, "usage": usage}
        return answer | ({"prompt_token_ids": prompts[0]} if chat else {})

    @app.post("/v1/completions")
    async def complete(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await generate(request, chat=True)

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_model, "object": "model"}]}

    app.add_middleware(PrimeRLMiddleware)
    return app, release


def weight_dir(root: Path, step: int, tensors: dict[str, torch.Tensor] | None = None,
               config: dict | None = None) -> Path:
    """A checkpoint directory `root/step_N`: `config.json` and one safetensors file; the default one fits a stand-in
    whose served model is `weight_dir(root, 0)` (the access policy's `model_dir`)."""
    path = root / f"step_{step}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {"model_type": "tiny", "hidden_size": 1}))
    save_file(tensors or {"w": torch.zeros(1)}, str(path / "model.safetensors"))
    return path

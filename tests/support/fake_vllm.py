"""A stand-in for vLLM's OpenAI app behind prime-rl's middleware, so that the vLLM glue is tested without vLLM.

`fake_vllm_app(engine_client)` is a FastAPI app with `app.state.engine_client` (what the middleware calls for weight
updates and `/reset`: `FakeEngineClient` records the calls; it also generates, one token at a time, labelling each
with its weight version as vLLM 0.32's engine does, and pauses and resumes as vLLM's `pause_generation` does, in
mode "keep" or "abort") and `PrimeRLMiddleware` added, as `vllm --middleware` adds it. Its generate routes call
the engine client's
`generate` once per prompt, as vLLM's do, and answer as vLLM 0.32 does with `return_token_ids` and `logprobs`: one
token per character (the token id is the code point), every choice the completion `answer` (`ANSWER`) cut at
`max_tokens`, `n` choices per prompt,
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
from types import SimpleNamespace

import httpx
import torch
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from safetensors.torch import save_file

from prime_rl.inference.vllm.middleware import PrimeRLMiddleware

ANSWER = "ok"
LOGPROB = -0.5


class FakeEngineClient:
    """vLLM's engine client as the middleware uses it: `collective_rpc`, `reset_prefix_cache`, `pause_generation`,
    `resume_generation` and `update_weight_version`, recorded (but `update_weight_version`, which `versions` keeps);
    the first `fail` `collective_rpc` calls raise. `generate` samples `answer` one token per engine step (`token_s`
    apart), each labelled with the version set then; with `steps` (a semaphore) each token waits for a release, and
    none is sampled while paused. Its final output's completions carry `weight_versions` spans as vLLM 0.32's do.
    `pause_generation(mode="abort")` ends every running generation at its next step: its final output has the
    tokens so far and `finish_reason` "abort"; a prompt that is an aborted generation's prompt plus those tokens
    continues the answer where it stopped, as a model would."""

    def __init__(self, fail: int = 0, answer: str = ANSWER, token_s: float = 0.0):
        self.calls: list[tuple] = []
        self.fail = int(fail)
        self.answer, self.token_s = answer, token_s
        self.version = "default"  # vLLM's engine starts with this label
        self.versions: list[str] = []
        self.paused = False
        self.aborts = 0  # pauses in mode "abort" so far
        self.continued: dict[tuple[int, ...], int] = {}  # an aborted generation's prompt + tokens -> answer position
        self.steps: asyncio.Semaphore | None = None
        self.waiting = 0  # generations waiting for a release of `steps`
        self.sampled = 0  # tokens sampled so far, every generation
        self._resumed = asyncio.Event()
        self._resumed.set()

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append((method, args))
        if self.fail:
            self.fail -= 1
            raise RuntimeError("shape mismatch")

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", ()))

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        self.calls.append(("pause_generation", (mode, clear_cache)))
        self.aborts += mode == "abort"
        self.paused = True
        self._resumed.clear()

    async def resume_generation(self):
        self.calls.append(("resume_generation", ()))
        self.paused = False
        self._resumed.set()

    async def update_weight_version(self, version: str):
        self.version = version
        self.versions.append(version)

    def generate(self, prompt, params: dict, request_id: str, **kwargs):
        """`params`: n and max_tokens. One final output (`SimpleNamespace`, vLLM's RequestOutput's fields that the
        middleware reads): each completion's index, token ids and weight-version spans."""
        return self._generate(list(prompt), params["n"], params["max_tokens"])

    async def _generate(self, prompt: list[int], n: int, max_tokens: int):
        labels: list[str] = []
        await self._resumed.wait()  # vLLM holds a request added while paused
        aborts, start = self.aborts, self.continued.get(tuple(prompt), 0)
        answer = token_ids(self.answer)[start:]
        finish = "stop" if len(answer) <= max_tokens else "length"
        for _ in answer[:max_tokens]:
            if self.steps is not None:
                self.waiting += 1
                try:
                    await self.steps.acquire()
                finally:
                    self.waiting -= 1
            await asyncio.sleep(self.token_s)
            await self._resumed.wait()
            if self.aborts != aborts:
                finish = "abort"
                break
            labels.append(self.version)
            self.sampled += 1
        spans = [SimpleNamespace(version=v, start=s, end=s + len(list(g)))
                 for (v, g), s in _runs(labels)]
        ids = answer[:len(labels)]
        if finish == "abort":
            self.continued[tuple(prompt + ids)] = start + len(ids)
        yield SimpleNamespace(finished=True, outputs=[
            SimpleNamespace(index=i, token_ids=ids, weight_versions=spans if labels else [], finish_reason=finish)
            for i in range(n)])


def _runs(labels: list[str]):
    """((label, the run of it), the run's start) for each run of equal labels."""
    start = 0
    for label, group in itertools.groupby(labels):
        run = list(group)
        yield (label, run), start
        start += len(run)


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


def max_tokens(body: dict, answer: str) -> int:
    return body.get("max_tokens") or body.get("max_completion_tokens") or len(answer)


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
        engine, prompts, n = app.state.engine_client, prompts_of(body), body.get("n", 1)
        params = {"n": n, "max_tokens": max_tokens(body, engine.answer)}
        finals = [[o async for o in engine.generate(p, params, f"cmpl-{i}")][-1] for i, p in enumerate(prompts)]
        choices = []
        for p, final in zip(prompts, finals, strict=True):
            for out in final.outputs:
                index = len(choices)
                choices.append(chat_choice(index, out.token_ids, out.finish_reason) if chat
                               else completion_choice(index, out.token_ids, out.finish_reason, p))
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        usage = {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": completion_tokens}
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


def stepped_app(answer: str) -> tuple[FakeEngineClient, FastAPI]:
    """A stand-in whose engine samples each token of `answer` only when `engine.steps` is released (None: freely)."""
    engine = FakeEngineClient(answer=answer)
    app, _ = fake_vllm_app(engine)
    engine.steps = asyncio.Semaphore(0)
    return engine, app


async def until(condition, what: str, timeout_s: float = 30.0) -> None:
    """Wait until `condition()` holds, yielding to the event loop (a scenario's order by state, never by a sleep: on a
    loaded machine a request may take longer than any fixed pause to reach the engine); AssertionError naming
    `what` after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"waited {timeout_s:.0f}s for {what}")
        await asyncio.sleep(0.005)


def run_scenario(scenario, timeout_s: float = 120.0):
    """`asyncio.run(scenario)`, failing after `timeout_s` instead of hanging the suite."""
    return asyncio.run(asyncio.wait_for(scenario, timeout_s))


def app_client(app: FastAPI, **options) -> httpx.AsyncClient:
    """An HTTP client served in-process by `app` (`options`: httpx.ASGITransport's)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, **options), base_url="http://127.0.0.1")


def weight_dir(root: Path, step: int, tensors: dict[str, torch.Tensor] | None = None,
               config: dict | None = None) -> Path:
    """A checkpoint directory `root/step_N`: `config.json` and one safetensors file; the default one fits a stand-in
    whose served model is `weight_dir(root, 0)` (the access policy's `model_dir`)."""
    path = root / f"step_{step}"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config or {"model_type": "tiny", "hidden_size": 1}))
    save_file(tensors or {"w": torch.zeros(1)}, str(path / "model.safetensors"))
    return path

"""Async HTTP client of the inference server: chat completions with token ids, weight updates.

Reads the response contract of docs/inference.md (both backends): top-level
`prompt_token_ids` and `weight_step`; per choice `token_ids`, `finish_reason` and
`logprobs.content[].logprob`. Requests ask for `n` completions of one prompt with
`logprobs: true, return_token_ids: true` (vLLM needs both). At most `max_concurrency`
requests are in flight; an unreachable server is retried until `connect_timeout_s`,
then the run fails with a one-line error naming the URL. With `api_key` set every request
carries `Authorization: Bearer <key>`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from prime_rl.orchestrator.config import ClientConfig
from prime_rl.utils.errors import PrimeError


class InferenceError(PrimeError):
    """The inference server failed, answered badly, or could not be reached in time."""


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" or "length"

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class ChatResult:
    prompt_token_ids: list[int]
    weight_step: int
    completions: list[Completion]


def server_root(base_url: str) -> str:
    """`http://host:port/v1` -> `http://host:port` (where /update_weights and /health live)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def parse_chat_response(data: dict[str, Any], n: int) -> ChatResult:
    """Turn one chat-completions JSON body into a `ChatResult`; a missing field is an InferenceError."""
    try:
        completions = []
        for choice in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(entry["logprob"]) for entry in choice["logprobs"]["content"]]
            if len(logprobs) != len(token_ids):
                raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
            text = (choice.get("message") or {}).get("content") or ""
            completions.append(Completion(token_ids, logprobs, text, choice["finish_reason"]))
        result = ChatResult([int(t) for t in data["prompt_token_ids"]], int(data.get("weight_step", 0)), completions)
    except (KeyError, TypeError, ValueError) as exc:
        raise InferenceError(f"malformed chat completion from the inference server ({type(exc).__name__}: {exc})") from None
    if len(completions) != n:
        raise InferenceError(f"asked the inference server for {n} completions, got {len(completions)}")
    return result


class InferenceClient:
    """One connection pool to the server; use as `async with InferenceClient(config) as client`."""

    def __init__(self, config: ClientConfig):
        self.config = config
        self.root = server_root(config.base_url)
        self.base_url = config.base_url.rstrip("/")
        self.model: str | None = None
        self._limit = asyncio.Semaphore(config.max_concurrency)
        limits = httpx.Limits(max_connections=config.max_concurrency, max_keepalive_connections=config.max_concurrency)
        headers = {"Authorization": f"Bearer {config.api_key.get_secret_value()}"} if config.api_key else {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=10.0), limits=limits,
                                       headers=headers)

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def _request(self, method: str, url: str, json: Any = None) -> dict[str, Any]:
        """One request; connection failures are retried until connect_timeout_s, then InferenceError."""
        deadline = time.monotonic() + self.config.connect_timeout_s
        delay = 0.2
        while True:
            try:
                response = await self._http.request(method, url, json=json)
                break
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                if time.monotonic() + delay > deadline:
                    raise InferenceError(
                        f"inference server at {self.root} unreachable for {self.config.connect_timeout_s:.0f}s "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except httpx.TimeoutException:
                raise InferenceError(
                    f"inference server at {self.root} did not answer {url} within {self.config.timeout_s:.0f}s"
                ) from None
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except Exception:
                message = response.text[:500]
            raise InferenceError(f"inference server answered {response.status_code} to {url}: {message}")
        return response.json()

    async def wait_ready(self) -> str:
        """Wait (up to connect_timeout_s) until the server lists its model; return the model id."""
        data = await self._request("GET", f"{self.base_url}/models")
        try:
            self.model = data["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise InferenceError(f"unexpected /v1/models answer from {self.root}: {str(data)[:200]}") from None
        return self.model

    async def chat(self, messages: list[dict[str, str]], n: int, temperature: float, top_p: float,
                   max_tokens: int, seed: int | None = None) -> ChatResult:
        body: dict[str, Any] = {
            "messages": messages,
            "n": n,
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "logprobs": True,
            "return_token_ids": True,
        }
        if self.model is not None:
            body["model"] = self.model
        if seed is not None:
            body["seed"] = seed
        async with self._limit:
            data = await self._request("POST", f"{self.base_url}/chat/completions", body)
        return parse_chat_response(data, n)

    async def served_step(self) -> int:
        """The weight step the server serves now (from a one-token request: works on every backend)."""
        result = await self.chat([{"role": "user", "content": "hi"}], 1, 1.0, 1.0, 1, seed=0)
        return result.weight_step

    async def update_weights(self, path: str, step: int) -> int:
        """Load `path` (a weights/step_N directory); return the step the server now serves."""
        data = await self._request("POST", f"{self.root}/update_weights", {"path": path, "step": step})
        return int(data.get("weight_step", step))

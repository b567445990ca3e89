"""Async HTTP client of the inference server: chat completions with token ids, weight updates.

Reads the response contract of docs/inference.md (both backends): top-level
`prompt_token_ids` and `weight_step`; per choice `token_ids`, `finish_reason`, the
logprobs (`logprobs.content[].logprob` from chat, `logprobs.token_logprobs` from
completions) and `token_weight_steps` (when absent: all `weight_step`). Requests ask for
`n` completions of one prompt, a chat prompt (`chat`) or exact token ids (`complete`, for
multi-turn rollouts), with logprobs and `return_token_ids: true` (vLLM needs both). At most
`max_concurrency` requests are in flight; an unreachable server is retried until
`connect_timeout_s`, then the run fails with a one-line error naming the URL. With `api_key` set
every request carries `Authorization: Bearer <key>`. `score_many` is the teacher's scoring call: the logprobs of
given token-id lists (`prompt_logprobs` on `/v1/completions`, read by `parse_batch_prompt_logprobs`).

A choice the server aborted for an in-flight weight update (`finish_reason: "abort"`, vLLM with `in_flight_kv =
"resubmit"`: its tokens so far, all of the step it was admitted under) is sent again as the prompt's token ids plus
those tokens, for the tokens left of `max_tokens` (`/v1/completions`, n = 1; seeded runs draw choice i's with
`resubmit_seed(seed + i, ...)`, as the servers seed choice i with seed + i), as often as updates abort it (at most
MAX_RESUBMITS times; past that an InferenceError), and the pieces are joined (`joined`): each
token keeps the step that sampled it, as AReaL counts versions per token. The joined text is the pieces' texts
end to end (a character whose bytes an abort split is decoded in two halves; the token ids, which train, are exact).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.utils.errors import PrimeError
from prime_rl.utils.net import server_root  # noqa: F401 (also this module's: tests import it here)

SPARE_CONNECTIONS = 2
CONNECT_ATTEMPT_S = 10.0  # one TCP connect; failed ones are retried until connect_timeout_s
TURN_SEED_STRIDE = 1_000_003
MAX_RESUBMITS = 64  # a choice aborted more often than this (by that many updates while it ran): InferenceError


def call_seed(seed: int | None, call: int) -> int | None:
    """The sampling seed of call `call` (0-based) of a rollout seeded `seed`: seed + call * TURN_SEED_STRIDE, modulo
    2^31 - 1 (None: unseeded). Each turn of a multi-turn rollout and each model call of an agent's session draws
    differently, and a resumed rollout draws the same again."""
    return None if seed is None else (seed + call * TURN_SEED_STRIDE) % (2**31 - 1)


def resubmit_seed(seed: int | None, resubmission: int) -> int | None:
    """The sampling seed of resubmission `resubmission` (1-based) of an aborted call seeded `seed`: another stream
    than the call's own (its first draws would repeat) and than the next calls' (`call_seed`)."""
    return None if seed is None else call_seed(seed, -resubmission)


def joined(first: RolloutCompletion, rest: RolloutCompletion) -> RolloutCompletion:
    """An aborted completion and its continuation as one: tokens, logprobs, steps and text end to end, the
    continuation's finish reason."""
    return RolloutCompletion(first.token_ids + rest.token_ids, first.logprobs + rest.logprobs, first.text + rest.text,
                             rest.finish_reason, first.weight_steps + rest.weight_steps)


class InferenceError(PrimeError):
    """The inference server failed, answered badly, or could not be reached in time (`unreachable`: it did not
    answer at all, so another server may; `orchestrator/servers.py`)."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


@dataclass
class RolloutCompletion:
    """One rollout's tokens after the prompt: one chat choice, or a whole multi-turn conversation
    (`orchestrator/rollouts/multi_turn.py`), whose environment tokens have `mask` false and logprob 0."""

    token_ids: list[int]
    logprobs: list[float]
    text: str  # of the (last) policy turn
    finish_reason: str  # "stop" or "length" ("abort" only inside the client: `InferenceClient._resubmitted`)
    weight_steps: list[int] = field(default_factory=list)  # the weight step each sampled token was sampled under
    mask: list[bool] | None = None  # per token: sampled by the policy (None: every token was)

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @classmethod
    def empty(cls) -> RolloutCompletion:
        """A record to build a rollout in, turn by turn (`add_sampled`, `add_context`)."""
        return cls([], [], "", "stop", [], [])

    def add_sampled(self, sampled: RolloutCompletion, text: str | None = None) -> None:
        """Append what the policy sampled in one call (its ids, logprobs, mask: all true for a plain choice, and
        weight steps); its finish reason and text (or `text`: what of it to keep) become the record's."""
        self.add_ids(sampled.token_ids, sampled.logprobs, sampled.sampled_mask())
        self.weight_steps += sampled.weight_steps
        self.finish_reason, self.text = sampled.finish_reason, sampled.text if text is None else text

    def add_context(self, ids: list[int]) -> None:
        """Append ids the policy did not sample (a template tail, an environment's reply): mask false, logprob 0."""
        self.add_ids(ids, [0.0] * len(ids), [False] * len(ids))

    def add_ids(self, ids: list[int], logprobs: list[float], mask: list[bool]) -> None:
        if self.mask is None:
            self.mask = [True] * len(self.token_ids)
        self.token_ids += ids
        self.logprobs += logprobs
        self.mask += mask

    def sampled_mask(self) -> list[bool]:
        """Per token: whether the policy sampled it (a copy)."""
        return [True] * len(self.token_ids) if self.mask is None else list(self.mask)

    def cut(self, position: int) -> None:
        """Keep the tokens before `position` (and the weight steps of the sampled ones among them)."""
        sampled = sum(self.sampled_mask()[:position])
        self.token_ids, self.logprobs = self.token_ids[:position], self.logprobs[:position]
        self.weight_steps = self.weight_steps[:sampled]
        self.mask = None if self.mask is None else self.mask[:position]


@dataclass
class ChatResult:
    prompt_token_ids: list[int]
    weight_step: int  # the step the request was admitted under
    completions: list[RolloutCompletion]

    def policy_step(self, completion: RolloutCompletion) -> int:
        """The oldest weight step of a completion's tokens (the admission step for one without tokens)."""
        return min(completion.weight_steps, default=self.weight_step)


def _choice_logprobs(choice: dict[str, Any]) -> list[float]:
    """Per-token logprobs of a chat choice (`logprobs.content[].logprob`) or a completion choice
    (`logprobs.token_logprobs`); none for a choice without tokens (one aborted before its first)."""
    logprobs = choice["logprobs"]
    if logprobs is None and choice["token_ids"] == []:
        return []
    if "content" in logprobs:
        return [float(entry["logprob"]) for entry in logprobs["content"]]
    return [float(lp) for lp in logprobs["token_logprobs"]]


def _choice_text(choice: dict[str, Any]) -> str:
    if "message" in choice:
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""


def parse_chat_response(data: dict[str, Any], n: int) -> ChatResult:
    """Turn one chat-completions or completions JSON body into a `ChatResult`; a missing field is an
    InferenceError."""
    try:
        weight_step = int(data.get("weight_step", 0))
        completions = []
        for choice in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            token_ids = [int(t) for t in choice["token_ids"]]
            logprobs = _choice_logprobs(choice)
            if len(logprobs) != len(token_ids):
                raise ValueError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs")
            steps = [int(s) for s in choice.get("token_weight_steps", [weight_step] * len(token_ids))]
            if len(steps) != len(token_ids):
                raise ValueError(f"{len(token_ids)} token ids but {len(steps)} token weight steps")
            completions.append(
                RolloutCompletion(token_ids, logprobs, _choice_text(choice), choice["finish_reason"], steps)
            )
        result = ChatResult([int(t) for t in data["prompt_token_ids"]], weight_step, completions)
    except (KeyError, TypeError, ValueError) as exc:
        raise InferenceError(
            f"malformed chat completion from the inference server ({type(exc).__name__}: {exc})"
        ) from None
    if len(completions) != n:
        raise InferenceError(f"asked the inference server for {n} completions, got {len(completions)}")
    return result


def parse_batch_prompt_logprobs(data: dict[str, Any], prompts: list[list[int]]) -> list[list[float]]:
    """The logprob of `ids[i]` given `ids[:i]`, for i >= 1, of every prompt `ids` of a scoring request (`prompt` a
    token-id list or a list of them, n = 1, `prompt_logprobs`; both backends answer in vLLM's shape): choice i (by
    its `index`) scores prompt i, and its own `prompt_token_ids`, when given, must be prompt i. Its
    `prompt_logprobs` is a list with null first and then, per token, an object that maps the token id, as a
    string, to `{"logprob": x, ...}`. Another count or length, another token, a non-number, NaN, infinity or a
    logprob above 0 is an InferenceError."""
    try:
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts):
            raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
        scored = []
        for i, (choice, ids) in enumerate(zip(choices, prompts, strict=True)):
            echoed = choice.get("prompt_token_ids")
            if echoed is not None and [int(t) for t in echoed] != ids:
                raise ValueError(f"choice {i}'s prompt_token_ids are not the ids of prompt {i}")
            scored.append(_choice_prompt_logprobs(choice, ids))
        return scored
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise InferenceError(f"malformed prompt logprobs from the server ({type(exc).__name__}: {exc})") from None


def _choice_prompt_logprobs(choice: dict[str, Any], ids: list[int]) -> list[float]:
    """One choice's `prompt_logprobs` of `ids` (ValueError and the like when malformed, InferenceError when a
    value is not a finite log-probability)."""
    entries = choice["prompt_logprobs"]
    if len(entries) != len(ids):
        raise ValueError(f"{len(entries)} prompt logprobs for {len(ids)} tokens")
    values = []
    for token, entry in zip(ids[1:], entries[1:], strict=True):
        value = entry[str(token)]["logprob"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"logprob {value!r} is not a number")
        values.append(float(value))
    bad = next((i for i, v in enumerate(values) if not (math.isfinite(v) and v <= 0.0)), None)
    if bad is not None:
        raise InferenceError(f"the server gave prompt token {bad + 1} (id {ids[bad + 1]}) the logprob {values[bad]}: "
                             "not a finite log-probability")
    return values


class InferenceClient:
    """One connection pool to the server; use as `async with InferenceClient(config) as client`."""

    def __init__(self, config: ClientConfig):
        self.config = config
        self.root = server_root(config.base_url)
        self.base_url = config.base_url.rstrip("/")
        self.model: str | None = None
        self.context_len: int | None = None  # the served context (`max_model_len` of /v1/models), when given
        self._limit = asyncio.Semaphore(config.max_concurrency)
        self._headers = {"Authorization": f"Bearer {config.api_key.get_secret_value()}"} if config.api_key else {}
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> InferenceClient:
        # aiohttp: its connection pool stays cheap at many concurrent requests (httpx's pool spent half the
        # orchestrator's CPU at 64 in flight: docs/benchmarks.md).
        self._http = aiohttp.ClientSession(
            headers=self._headers,
            # sock_connect, not connect: waiting for a pooled connection is no connection failure.
            timeout=aiohttp.ClientTimeout(total=self.config.timeout_s, sock_connect=CONNECT_ATTEMPT_S),
            # Chat requests are bounded by the semaphore; the spare connections keep a weight update or a
            # health check from queueing behind max_concurrency running chats.
            connector=aiohttp.TCPConnector(limit=self.config.max_concurrency + SPARE_CONNECTIONS),
        )
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.close()

    async def _request(self, method: str, url: str, payload: Any = None) -> dict[str, Any]:
        """One request; connection failures are retried for connect_timeout_s from the first one (a request that
        ran long before its server died is retried as long as a new one), then InferenceError."""
        deadline = None
        delay = 0.2
        while True:
            try:
                async with self._http.request(method, url, json=payload) as response:
                    status, body = response.status, await response.read()
                break
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                if isinstance(exc, aiohttp.ServerTimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError):
                    raise self._timeout(url) from None
                deadline = deadline or time.monotonic() + self.config.connect_timeout_s
                if time.monotonic() + delay > deadline:
                    raise InferenceError(
                        f"inference server at {self.root} unreachable for {self.config.connect_timeout_s:g}s "
                        f"({type(exc).__name__}: {exc})", unreachable=True
                    ) from None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except TimeoutError:
                raise self._timeout(url) from None
        if status != 200:
            try:
                message = json.loads(body)["error"]["message"]
            except Exception:
                message = body[:500].decode(errors="replace")
            raise InferenceError(f"inference server answered {status} to {url}: {message}")
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise InferenceError(f"inference server answered {url} with no JSON object: {body[:200]!r}")
        return data

    def _timeout(self, url: str) -> InferenceError:
        return InferenceError(f"inference server at {self.root} did not answer {url} within {self.config.timeout_s:g}s",
                              unreachable=True)

    async def wait_ready(self) -> str:
        """Wait (up to connect_timeout_s) until the server lists its model; return the model id."""
        data = await self._request("GET", f"{self.base_url}/models")
        try:
            self.model = data["data"][0]["id"]
            context_len = data["data"][0].get("max_model_len")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise InferenceError(f"unexpected /v1/models answer from {self.root}: {str(data)[:200]}") from None
        if isinstance(context_len, int) and not isinstance(context_len, bool) and context_len > 0:
            self.context_len = context_len
        return self.model

    async def chat(self, messages: list[dict[str, str]], n: int, rule: SamplingRule, max_tokens: int,
                   seed: int | None = None, template_kwargs: dict[str, Any] | None = None) -> ChatResult:
        """`n` completions of a chat prompt (the server applies the chat template, with `template_kwargs` as
        `chat_template_kwargs`: vLLM and the builtin server take them)."""
        prompt: dict[str, Any] = {"messages": messages}
        if template_kwargs:
            prompt["chat_template_kwargs"] = template_kwargs
        return await self._generate("chat/completions", prompt, n, rule, max_tokens, seed)

    async def complete(self, prompt_ids: list[int], n: int, rule: SamplingRule, max_tokens: int,
                       seed: int | None = None) -> ChatResult:
        """`n` completions of exactly these prompt token ids (token in, token out: nothing is re-tokenized)."""
        return await self._generate("completions", {"prompt": prompt_ids}, n, rule, max_tokens, seed)

    async def _generate(self, route: str, prompt: dict[str, Any], n: int, rule: SamplingRule, max_tokens: int,
                        seed: int | None) -> ChatResult:
        """One generate request, its aborted choices continued (module docstring)."""
        result = await self._generate_once(route, prompt, n, rule, max_tokens, seed)
        if any(c.finish_reason == "abort" for c in result.completions):
            result.completions = list(await asyncio.gather(*(
                self._resubmitted(result.prompt_token_ids, c, rule, max_tokens, None if seed is None else seed + i)
                for i, c in enumerate(result.completions))))
        return result

    async def _generate_once(self, route: str, prompt: dict[str, Any], n: int, rule: SamplingRule, max_tokens: int,
                             seed: int | None) -> ChatResult:
        body: dict[str, Any] = {
            **prompt,
            "n": n,
            "temperature": rule.temperature,
            "top_p": rule.top_p,
            "max_tokens": max_tokens,
            "logprobs": True if route == "chat/completions" else 0,  # completions: the sampled token's logprob
            "return_token_ids": True,
        }
        if rule.top_k > 0:
            body["top_k"] = rule.top_k
        if rule.min_p > 0:
            body["min_p"] = rule.min_p
        if self.model is not None:
            body["model"] = self.model
        if seed is not None:
            body["seed"] = seed
        async with self._limit:
            data = await self._request("POST", f"{self.base_url}/{route}", body)
        return parse_chat_response(data, n)

    async def _resubmitted(self, prompt_ids: list[int], completion: RolloutCompletion, rule: SamplingRule,
                           max_tokens: int, seed: int | None) -> RolloutCompletion:
        """`completion`, continued while an in-flight update aborted it (module docstring)."""
        for resubmission in range(1, MAX_RESUBMITS + 2):
            if completion.finish_reason != "abort":
                return completion
            left = max_tokens - len(completion.token_ids)
            if left <= 0:  # aborted as it sampled its last token
                completion.finish_reason = "length"
                return completion
            if resubmission > MAX_RESUBMITS:
                break
            rest = await self._generate_once("completions", {"prompt": prompt_ids + completion.token_ids}, 1, rule,
                                             left, resubmit_seed(seed, resubmission))
            completion = joined(completion, rest.completions[0])
        raise InferenceError(f"a completion was aborted by more than {MAX_RESUBMITS} weight updates (the server "
                             "aborts running requests at every in-flight update: vllm.in_flight_kv = 'resubmit')")

    async def score_many(self, prompts: list[list[int]], temperature: float) -> list[list[float]]:
        """Per token-id list `ids`: log p(ids[i] | ids[:i]) for i >= 1 under the served model at `temperature`
        (untruncated). One completions request for all (`prompt` a list of them, as both backends take it, which
        the server prefills together; one that fails fails them all) with `prompt_logprobs: 0` (and one generated
        token, which both backends need)."""
        body: dict[str, Any] = {"prompt": prompts, "n": 1, "max_tokens": 1, "temperature": temperature,
                                "prompt_logprobs": 0, "return_token_ids": True}
        if self.model is not None:
            body["model"] = self.model
        async with self._limit:
            data = await self._request("POST", f"{self.base_url}/completions", body)
        return parse_batch_prompt_logprobs(data, prompts)

    async def served_step(self) -> int:
        """The weight step the server serves now (from a one-token request: works on every backend)."""
        result = await self.chat([{"role": "user", "content": "hi"}], 1, SamplingRule(), 1, seed=0)
        return result.weight_step

    async def served_steps(self) -> list[int]:
        """[the served step] (`servers.ServerPool.served_steps` gives one per server)."""
        return [await self.served_step()]

    async def update_weights(self, path: str, step: int, in_flight: bool = False) -> int:
        """Load `path` (a weights/step_N directory); return the step the server now serves. `in_flight`:
        without draining the running requests (builtin backend)."""
        body: dict[str, Any] = {"path": path, "step": step}
        if in_flight:
            body["in_flight"] = True
        data = await self._request("POST", f"{self.root}/update_weights", body)
        return int(data.get("weight_step", step))

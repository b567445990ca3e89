"""The contract every inference backend serves (docs/inference.md: "API (both backends)", "Weight updates",
"Security"), one suite for all of them. Each test runs once per backend: every name in `BACKENDS` and the toy
backend this module registers for its duration (`toy_backend.py`, one module), each stood up in this process by its
harness (`HARNESSES`) and called through httpx's ASGI transport. A new backend gets the suite by being listed in
`HARNESSES`; `test_every_registered_backend_has_a_harness` fails until it is.

The contract:

1. **Answers.** `POST /v1/completions` and `POST /v1/chat/completions` answer 200 with `object`, the top-level
   `weight_step` (the step served) and `prompt_token_ids` (the prompt as the model saw it; token ids sent come back
   as sent), `n` choices indexed from 0, each with `token_ids`, `token_weight_steps` (one per token id, each the
   answer's `weight_step`: updates drain by default), `finish_reason` "stop" or "length" (at most `max_tokens`
   tokens) and logprobs in the OpenAI shapes, one per token id, finite and <= 0: chat `logprobs.content[]` of
   `token`, `logprob`, `bytes` (the token's UTF-8) and `top_logprobs`; completions `tokens`, `token_logprobs`,
   `top_logprobs` and `text_offset` (the running sum of the tokens' lengths); `usage.completion_tokens` counts them.
2. **Errors** are `{"error": {"message", "type", "code"}}`: one line, the status's name ending in "Error", the
   status; the server goes on serving.
3. **Access.** 401 (with `WWW-Authenticate: Bearer`) without the API key or with a wrong one, on every route but
   `GET /health`; for an admin request (`/update_weights`, `/reset`) 403 when its Host is not this server and 415
   when it is not `application/json`; 413 for a body above `max_request_bytes`.
4. **Requests.** 400 for a body that is not strict JSON (NaN, Infinity, a number that overflows, a lone surrogate,
   nesting deeper than 32, not UTF-8), for prompt + `max_tokens` beyond the context (a request that just fits is
   served), and for prompts x `n` x `max_tokens` past `max_request_tokens` (the engine never sees it; one at the
   budget is served); 404 for another model's name; 400 for an invalid field.
5. **Weight updates.** `POST /update_weights` answers 403 for a path outside the allowed weight directories (also
   through `..`), 400 for a directory that does not exist or is no weight directory and for an invalid body, each
   keeping the served step;
   200 `{"weight_step": N}` for a directory that fits, after which every answer is served under step N;
   `"in_flight": true` is served the same where the backend's loader swaps weights in flight, else it is a 400
   naming that, the step kept.
6. **The rest.** `GET /health` answers 200 without the key, `GET /v1/models` lists the served model, `POST /reset`
   answers 200; an unknown route is a 404 and a known one called with the wrong method a 405 naming the methods it
   takes (`Allow`), both JSON errors.

The harnesses:

- **builtin**: `builtin/app.create_app` around a real tiny `Engine` (the `tiny_model_dir` model at a context of 32
  tokens, one per module), with its own gate per test.
- **vllm**: the middleware (`vllm/middleware.py`) around a stand-in of vLLM's app (`tests/support/fake_vllm.py`),
  configured through the environment as the launcher configures it. This tests the middleware's side of the
  contract without vLLM: what vLLM itself answers (another model's 404, an invalid field's 400, the list of models,
  an unknown route) is skipped here, and the answers' tokens and logprobs are the stand-in's. vLLM itself is
  checked by the `vllm` tests of `tests/inference/test_server.py` where it is installed (a real vLLM server
  starts in a subprocess in 35-60 s, too slow for this suite).
- **toy**: `toy_backend.py`, registered in `BACKENDS` while this module runs (`Registry.scoped`), around its stand-in
  engine.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from prime_rl.configs.base import BaseConfig
from prime_rl.inference.builtin.app import create_app
from prime_rl.inference.config import BACKENDS
from prime_rl.inference.gate import WeightGate
from prime_rl.inference.vllm.middleware import CONTEXT_ENV, SERVED_NAME_ENV
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.protocol import budget_overflow, context_overflow
from tests.support.fake_vllm import FakeEngineClient, fake_vllm_app, weight_dir

KEY = "contract-key"
CONTEXT = 32
MAX_BYTES = 10_000
BUDGET = 100
SERVED = "served-model"
TEST_BACKENDS = {"toy": "tests.inference.toy_backend"}
"""Backends written in tests: name -> the module whose import registers it (for this module's duration)."""
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TOKENS = [5, 6, 7]  # a token-id prompt: the same 3 prompt tokens on every backend


@dataclass
class Served:
    """A backend stood up for one test."""

    app: Any
    in_flight: bool
    """Whether its loader applies `"in_flight": true` updates."""
    engine_requests: Callable[[], int]
    """How many generate requests reached its engine."""
    fitting_update: Callable[[int], Path]
    """A weight directory `step_N` under the allowed root that fits the served model."""
    root: Path
    engine_answers: frozenset[str] = field(default_factory=frozenset)
    """Clauses the engine it wraps answers (skipped: see the module docstring)."""

    def skip_if_engine_answers(self, clause: str) -> None:
        if clause in self.engine_answers:
            pytest.skip(f"{clause}: answered by the engine this backend wraps, not by prime-rl's code")

    def send(self, *requests: dict, key: str | None = KEY) -> list[httpx.Response]:
        """Each request (`httpx.AsyncClient.request` arguments) with the API key `key`, concurrently."""

        async def go():
            transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
            headers = {"authorization": f"Bearer {key}"} if key else {}
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000", headers=headers,
                                         timeout=60) as client:
                return await asyncio.gather(*(client.request(**request) for request in requests))

        return asyncio.run(go())

    def post(self, path: str, body: Any = None, **kwargs) -> httpx.Response:
        return self.send({"method": "POST", "url": path, "json": body, **kwargs})[0]

    def served_step(self) -> int:
        """The step a generate request is served under now."""
        answer = self.post("/v1/completions", {"prompt": TOKENS, "max_tokens": 1})
        assert answer.status_code == 200, answer.text
        return answer.json()["weight_step"]


def access_policy(root: Path, model_dir: Path | None = None) -> AccessPolicy:
    return AccessPolicy(api_key=KEY, max_request_bytes=MAX_BYTES, max_request_tokens=BUDGET, weight_roots=(root,),
                        model_dir=str(model_dir) if model_dir else None)


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from prime_rl.inference.builtin.engine import Engine

    engine = Engine(str(tiny_model_dir), context_len=CONTEXT, seed=0, max_batch_size=16)
    yield engine
    engine.close()


def builtin_harness(request: pytest.FixtureRequest, root: Path) -> Served:
    engine, model = request.getfixturevalue("tiny_engine"), request.getfixturevalue("tiny_model_dir")
    engine.weight_step = 0  # what an earlier test's update left (those reload the model's own weights)
    prompts, submit = [], engine.submit

    def counted_submit(prompt_ids, *args, **kwargs):
        prompts.append(prompt_ids)
        return submit(prompt_ids, *args, **kwargs)

    request.getfixturevalue("monkeypatch").setattr(engine, "submit", counted_submit)
    app = create_app(engine, SERVED, WeightGate(), access_policy(root))
    return Served(app, True, lambda: len(prompts), lambda step: shutil.copytree(model, root / f"step_{step}"), root)


def vllm_harness(request: pytest.FixtureRequest, root: Path) -> Served:
    monkeypatch = request.getfixturevalue("monkeypatch")
    model = weight_dir(root, 0)  # the checkpoint vLLM started from, what an update must fit
    launcher_env = {**access_policy(root, model).to_env(), CONTEXT_ENV: str(CONTEXT), SERVED_NAME_ENV: SERVED}
    for name, value in launcher_env.items():
        monkeypatch.setenv(name, value)
    app, _ = fake_vllm_app(FakeEngineClient(), SERVED)
    return Served(app, True, lambda: len(app.state.generated), lambda step: weight_dir(root, step), root,
                  frozenset({"another model's name", "invalid fields", "the list of models", "an unknown route"}))


@pytest.fixture(scope="module")
def backends_written_in_tests():
    """The backends written in tests, registered until the module ends (then BACKENDS is as it was)."""
    with BACKENDS.scoped():
        modules = {}
        for name, module in TEST_BACKENDS.items():
            modules[name] = importlib.import_module(module)
            if name not in BACKENDS.names:  # imported (and registered) by an earlier scope: register it again
                modules[name] = importlib.reload(modules[name])
        yield modules


def toy_harness(request: pytest.FixtureRequest, root: Path) -> Served:
    toy = request.getfixturevalue("backends_written_in_tests")["toy"]
    engine = toy.ToyEngine()
    app = toy.create_app(engine, SERVED, CONTEXT, WeightGate(), access_policy(root))
    return Served(app, False, lambda: len(engine.prompts), lambda step: weight_dir(root, step), root)


HARNESSES: dict[str, Callable[[pytest.FixtureRequest, Path], Served]] = {
    "builtin": builtin_harness, "vllm": vllm_harness, "toy": toy_harness}
"""Every backend's harness: how this suite stands it up in-process (a registered backend without one fails)."""


def missing_harnesses() -> list[str]:
    return [name for name in BACKENDS.names if name not in HARNESSES]


@pytest.fixture(params=[*BACKENDS.names, *TEST_BACKENDS])
def served(request, tmp_path) -> Served:
    if request.param not in HARNESSES:
        pytest.fail(f"backend '{request.param}' has no harness in HARNESSES: list it to run the contract suite")
    if request.param in TEST_BACKENDS:
        request.getfixturevalue("backends_written_in_tests")
    assert request.param in BACKENDS.names  # the suite runs the registered backends, the test's own included
    root = tmp_path / "weights"
    root.mkdir()
    return HARNESSES[request.param](request, root.resolve())


def assert_error(response: httpx.Response, status: int, words: str = "") -> None:
    """The contract's error answer: `status`, and the JSON error body naming it in one line."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"].endswith("Error"), error
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"], error
    assert words in error["message"], error


# ---------------------------------------------------------------------------------------------------- the suite


def test_every_registered_backend_has_a_harness(backends_written_in_tests):
    assert missing_harnesses() == []
    with BACKENDS.scoped():  # a backend registered without a harness is named
        BACKENDS.config(type("UnlistedConfig", (BaseConfig,), {"__annotations__": {"name": ClassVar[str]},
                                                               "name": "unlisted"}))
        assert missing_harnesses() == ["unlisted"]
    assert "unlisted" not in BACKENDS.names


def test_the_toy_backend_is_one_module_and_one_registration(backends_written_in_tests):
    """Its options class and serve function are registered as the builtin ones are: by importing its module."""
    toy = backends_written_in_tests["toy"]
    assert BACKENDS.configs["toy"] is toy.ToyConfig and BACKENDS.implementation("toy") is toy.serve_toy
    assert BACKENDS.drift() == []


def check_choices(data: dict, n: int, max_tokens: int) -> None:
    """The contract's answer fields (module docstring, 1)."""
    step = data["weight_step"]
    assert isinstance(step, int) and [c["index"] for c in data["choices"]] == list(range(n))
    assert all(isinstance(t, int) for t in data["prompt_token_ids"]) and data["prompt_token_ids"]
    for choice in data["choices"]:
        ids = choice["token_ids"]
        assert 1 <= len(ids) <= max_tokens and all(isinstance(t, int) for t in ids)
        assert choice["token_weight_steps"] == [step] * len(ids)
        assert choice["finish_reason"] in ("stop", "length")
    assert data["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in data["choices"])


def check_logprobs(logprobs: list[float], ids: list[int]) -> None:
    assert len(logprobs) == len(ids) and all(math.isfinite(lp) and lp <= 0 for lp in logprobs)


def test_answers_carry_the_weight_step_token_ids_and_openai_logprobs(served):
    chat, completion = served.send(
        {"method": "POST", "url": "/v1/chat/completions",
         "json": {**CHAT, "n": 2, "max_tokens": 3, "logprobs": True, "return_token_ids": True}},
        {"method": "POST", "url": "/v1/completions",
         "json": {"prompt": TOKENS, "n": 2, "max_tokens": 3, "logprobs": 1, "return_token_ids": True}})
    assert chat.status_code == 200 and completion.status_code == 200, (chat.text, completion.text)
    data = chat.json()
    assert data["object"] == "chat.completion"
    check_choices(data, 2, 3)
    for choice in data["choices"]:
        entries = choice["logprobs"]["content"]
        check_logprobs([entry["logprob"] for entry in entries], choice["token_ids"])
        assert all(e["bytes"] == list(e["token"].encode()) and e["top_logprobs"] == [] for e in entries)
        assert choice["message"]["role"] == "assistant"
    data = completion.json()
    assert data["object"] == "text_completion" and data["prompt_token_ids"] == TOKENS
    check_choices(data, 2, 3)
    for choice in data["choices"]:
        logprobs = choice["logprobs"]
        check_logprobs(logprobs["token_logprobs"], choice["token_ids"])
        assert len(logprobs["tokens"]) == len(choice["token_ids"]) and logprobs["top_logprobs"] is None
        assert logprobs["text_offset"] == list(itertools.accumulate((len(t) for t in logprobs["tokens"][:-1]),
                                                                    initial=0))


def test_the_api_key_is_needed_on_every_route_but_health(served):
    routes = [("POST", "/v1/completions", {"prompt": TOKENS}), ("POST", "/v1/chat/completions", CHAT),
              ("GET", "/v1/models", None), ("POST", "/update_weights", {"path": str(served.root)}),
              ("POST", "/reset", {})]
    for key in (None, "wrong"):
        for response in served.send(*({"method": m, "url": u, "json": b} for m, u, b in routes), key=key):
            assert_error(response, 401, "missing or wrong API key")
            assert response.headers["www-authenticate"] == "Bearer" and KEY not in response.text
    (health,) = served.send({"method": "GET", "url": "/health"}, key=None)
    assert health.status_code == 200
    assert served.engine_requests() == 0


def test_admin_requests_need_this_servers_host_and_json_and_bodies_are_capped(served):
    for path in ("/update_weights", "/reset"):
        rebound, plain = served.send(
            {"method": "POST", "url": path, "json": {}, "headers": {"host": "attacker.example:8000"}},
            {"method": "POST", "url": path, "content": b"{}", "headers": {"content-type": "text/plain"}})
        assert_error(rebound, 403, "attacker.example")
        assert_error(plain, 415, "application/json")
    (big,) = served.send({"method": "POST", "url": "/v1/completions", "content": b"x" * (MAX_BYTES + 1),
                          "headers": {"content-type": "application/json"}})
    assert_error(big, 413, f"exceeds the limit of {MAX_BYTES} bytes")
    assert served.engine_requests() == 0 and served.served_step() == 0


STRICT = [b'{"prompt": "a", "temperature": NaN}', b'{"prompt": "a", "temperature": Infinity}',
          b'{"prompt": "a", "max_tokens": 1e999}', b'{"prompt": "\\ud800"}', b'{"prompt": ' + b"[" * 40 + b"]" * 40
          + b"}", b'{"prompt": "\xff"}']


def test_what_is_not_strict_json_is_a_400_before_the_engine_sees_it(served):
    for path in ("/v1/completions", "/v1/chat/completions"):
        answers = served.send(*({"method": "POST", "url": path, "content": raw,
                                 "headers": {"content-type": "application/json"}} for raw in STRICT))
        for raw, response in zip(STRICT, answers, strict=True):
            assert_error(response, 400)
            assert "JSON" in response.json()["error"]["message"] or "surrogate" in response.text, raw
    assert served.engine_requests() == 0


def test_prompt_plus_max_tokens_beyond_the_context_is_a_400_and_what_fits_is_served(served):
    fits, overflows = served.send(
        {"method": "POST", "url": "/v1/completions", "json": {"prompt": TOKENS, "max_tokens": CONTEXT - 3}},
        {"method": "POST", "url": "/v1/completions", "json": {"prompt": TOKENS, "max_tokens": CONTEXT - 2}})
    assert fits.status_code == 200, fits.text
    assert_error(overflows, 400, context_overflow(3, CONTEXT - 2, CONTEXT))


def test_a_request_past_the_token_budget_is_a_400_before_the_engine_sees_it(served):
    """prompts x n x max_tokens past max_request_tokens (max_tokens unset: the room the context leaves, or the
    context where the backend cannot count the prompt first); at the budget it is served."""
    batch = {"prompt": [TOKENS[:2]] * 2, "n": 5, "max_tokens": 11}
    over, unset, chat = served.send(
        {"method": "POST", "url": "/v1/completions", "json": batch},
        {"method": "POST", "url": "/v1/completions", "json": {"prompt": TOKENS, "n": 17}},
        {"method": "POST", "url": "/v1/chat/completions", "json": {**CHAT, "n": 26, "max_tokens": 4}})
    assert_error(over, 400, budget_overflow(2, 5, 11, BUDGET))
    unset_limits = (CONTEXT - 3, CONTEXT)  # the room the prompt leaves (builtin, toy), the context (vLLM)
    assert any(f"= 1 x 17 x {limit})" in unset.json()["error"]["message"] for limit in unset_limits), unset.text
    assert_error(chat, 400, "(prompts x n x max_tokens = 1 x 26 x 4)")
    assert served.engine_requests() == 0
    at_budget = served.post("/v1/completions", {**batch, "max_tokens": 10})
    assert at_budget.status_code == 200 and len(at_budget.json()["choices"]) == 10, at_budget.text


def test_another_models_name_is_a_404(served):
    served.skip_if_engine_answers("another model's name")
    assert_error(served.post("/v1/completions", {"prompt": TOKENS, "model": "other"}), 404, "other")
    assert served.post("/v1/completions", {"prompt": TOKENS, "max_tokens": 1, "model": SERVED}).status_code == 200


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": TOKENS, "n": 0}), ("/v1/completions", {"prompt": TOKENS, "temperature": -1}),
    ("/v1/completions", {"prompt": TOKENS, "max_tokens": "8"}), ("/v1/chat/completions", {"max_tokens": 3}),
])
def test_an_invalid_field_is_a_400(served, path, body):
    served.skip_if_engine_answers("invalid fields")
    assert_error(served.post(path, body), 400)


def test_a_refused_update_keeps_the_served_step(served):
    outside = served.root.parent / "step_5"
    refusals = [({"path": "/"}, 403, "outside the allowed weight directories"),
                ({"path": f"{served.root}/../{outside.name}"}, 403, "outside the allowed weight directories"),
                ({"path": str(served.root / "step_9")}, 400, "does not exist"),
                ({"path": str(served.root)}, 400, "is not a weight directory"),
                ({"nope": 1}, 400, "invalid request")]
    shutil.copytree(served.fitting_update(5), outside)  # fits, but lies outside the allowed root
    for body, status, words in refusals:
        assert_error(served.post("/update_weights", body), status, words)
    assert served.served_step() == 0


def test_an_update_that_fits_is_served_from_the_next_request_on(served):
    update = served.post("/update_weights", {"path": str(served.fitting_update(3))})
    assert update.status_code == 200 and update.json() == {"weight_step": 3}, update.text
    chat, completion = (served.post(path, body) for path, body in (
        ("/v1/chat/completions", {**CHAT, "max_tokens": 2}), ("/v1/completions", {"prompt": TOKENS, "max_tokens": 2})))
    for answer in (chat.json(), completion.json()):
        assert answer["weight_step"] == 3
        assert all(c["token_weight_steps"] == [3] * len(c["token_ids"]) for c in answer["choices"])
    in_flight = served.post("/update_weights", {"path": str(served.fitting_update(4)), "in_flight": True})
    if served.in_flight:
        assert in_flight.status_code == 200 and in_flight.json() == {"weight_step": 4}
    else:
        assert_error(in_flight, 400, "in-flight weight update refused")
    assert served.served_step() == (4 if served.in_flight else 3)


def test_health_models_reset_and_unknown_routes(served):
    health, reset = served.send({"method": "GET", "url": "/health"}, {"method": "POST", "url": "/reset", "json": {}})
    assert health.status_code == 200 and reset.status_code == 200, reset.text
    if "the list of models" not in served.engine_answers:
        models = served.send({"method": "GET", "url": "/v1/models"})[0]
        assert [card["id"] for card in models.json()["data"]] == [SERVED]
    served.skip_if_engine_answers("an unknown route")
    missing, method = served.send({"method": "GET", "url": "/v2/nothing"}, {"method": "GET", "url": "/reset"})
    assert_error(missing, 404)
    assert_error(method, 405)
    assert method.headers["allow"] == "POST"  # RFC 9110: a 405 says which methods the route takes

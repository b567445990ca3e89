"""The builtin HTTP app around a stand-in engine: every error body is JSON, engine failures included."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

import httpx

from prime_rl.inference.builtin.app import create_app
from prime_rl.inference.builtin.engine import Completion
from prime_rl.inference.gate import WeightGate
from prime_rl.utils.char_tokenizer import build_char_tokenizer


class StubEngine:
    """Answers "ok" to every prompt, except prompts starting with "boom", whose future fails."""

    tokenizer = build_char_tokenizer()
    context_len = 64
    alive = True

    def submit(self, prompt_ids, params, n=1):
        future = Future()
        if self.tokenizer.decode(prompt_ids).startswith("boom"):
            future.set_exception(RuntimeError("the engine broke on this request"))
        else:
            future.set_result([Completion([5], [-0.5], "ok", "length")] * n)
        return future


def call(requests: list[tuple[str, str, dict | None]]) -> list[httpx.Response]:
    app = create_app(StubEngine(), "stub", WeightGate())

    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            return await asyncio.gather(*(client.request(m, p, json=b) for m, p, b in requests))

    return asyncio.run(go())


def test_framework_and_engine_errors_are_json_and_other_requests_go_on():
    boom, fine, missing, method, models = call([
        ("POST", "/v1/completions", {"prompt": "boom", "max_tokens": 2}),
        ("POST", "/v1/completions", {"prompt": "fine", "max_tokens": 2}),
        ("GET", "/nowhere", None),
        ("PATCH", "/v1/chat/completions", None),
        ("GET", "/v1/models", None),
    ])
    assert boom.status_code == 500
    assert boom.json() == {"error": {"message": "internal server error (RuntimeError)", "type": "InternalServerError",
                                     "code": 500}}
    assert fine.status_code == 200 and fine.json()["choices"][0]["text"] == "ok"
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert method.status_code == 405 and method.json()["error"]["code"] == 405
    assert models.json()["data"][0]["id"] == "stub"


def test_update_weights_without_allowed_directories_is_refused_with_a_clear_403(tmp_path):
    (response,) = call([("POST", "/update_weights", {"path": str(tmp_path)})])
    assert response.status_code == 403
    assert "no weight directory is allowed" in response.json()["error"]["message"]

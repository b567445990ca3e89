"""The builtin HTTP app: around a stand-in engine, every error body is JSON (engine failures included) and
the logprobs entries are what their definitions say; around the real engine, weight updates in flight."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from prime_rl.chat.tool_calls import format_tool_call
from prime_rl.inference.builtin.app import create_app
from prime_rl.inference.builtin.engine import Completion, Engine
from prime_rl.inference.gate import WeightGate
from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.models.tiny_model import save_random_model
from prime_rl.openai_api.access import AccessPolicy

ANSWER = "ok, <|im_end|>"  # several tokens, a special one among them


class StubEngine:
    """Answers ANSWER to every prompt, except prompts starting with "boom", whose future fails."""

    tokenizer = build_char_tokenizer()
    vocab = len(tokenizer)
    context_len = 64
    alive = True

    def submit(self, prompt_ids, params, n=1, owner=None):
        future = Future()
        if self.tokenizer.decode(prompt_ids).startswith("boom"):
            future.set_exception(RuntimeError("the engine broke on this request"))
        else:
            ids = self.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
            future.set_result([Completion(ids, [-0.5] * len(ids), ANSWER, "length", [7] * len(ids))] * n)
        return future


def client_of(app) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60)


def call(requests: list[tuple[str, str, dict | None]], engine=None, access=None) -> list[httpx.Response]:
    app = create_app(engine or StubEngine(), "stub", WeightGate(), access)

    async def go():
        async with client_of(app) as client:
            return await asyncio.gather(*(client.request(m, p, json=b) for m, p, b in requests))

    return asyncio.run(go())


def test_an_engine_failure_is_a_json_500_and_the_other_requests_go_on():
    """(Every backend's JSON errors, the framework's 404 and 405 among them:
    tests/inference/test_backend_contract.py.)"""
    boom, fine, trace = call([
        ("POST", "/v1/completions", {"prompt": "boom", "max_tokens": 2}),
        ("POST", "/v1/completions", {"prompt": "fine", "max_tokens": 2}),
        ("TRACE", "/health", None),
    ])
    assert boom.status_code == 500
    assert boom.json() == {"error": {"message": "internal server error (RuntimeError)", "type": "InternalServerError",
                                     "code": 500}}
    assert fine.status_code == 200 and fine.json()["choices"][0]["text"] == ANSWER
    assert trace.status_code == 405 and trace.headers["allow"] == "GET"


def test_update_weights_without_allowed_directories_is_refused_with_a_clear_403(tmp_path):
    (response,) = call([("POST", "/update_weights", {"path": str(tmp_path)})])
    assert response.status_code == 403
    assert "no weight directory is allowed" in response.json()["error"]["message"]


def test_special_tokens_show_their_text_and_the_answer_step_is_its_first_tokens():
    """The logprobs show a special token by its text (EOS included), and an answer's `weight_step` is the step its
    first tokens were sampled under (the engine's, 7 here, not the gate's 0). (The logprobs' shapes and definitions
    every backend answers: tests/inference/test_backend_contract.py.)"""
    chat, completion = call([
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}),
        ("POST", "/v1/completions", {"prompt": "hi", "n": 2}),
    ])
    ids = StubEngine.tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    texts = [StubEngine.tokenizer.decode([t]) for t in ids]
    assert len(ids) > 3 and texts[-1] == "<|im_end|>"
    for choice in chat.json()["choices"]:
        assert [entry["token"] for entry in choice["logprobs"]["content"]] == texts
        assert choice["token_weight_steps"] == [7] * len(ids)
    for choice in completion.json()["choices"]:
        assert choice["logprobs"]["tokens"] == texts and choice["token_weight_steps"] == [7] * len(ids)
    assert chat.json()["weight_step"] == completion.json()["weight_step"] == 7


TOOL_TEMPLATE = (  # renders `tools` and assistant `tool_calls` as Qwen's template does (arguments through tojson)
    "{% for tool in tools or [] %}{{ 'tool:' + tool['function']['name'] + '\n' }}{% endfor %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') }}"
    "{% for c in m['tool_calls'] or [] %}"
    "{{ '<tool_call>' + {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object", "properties": {}}}}]
CALLS = format_tool_call("multiply", {"a": 12, "b": 34}) + format_tool_call("add", {"a": 1, "b": 2})


class ScriptedEngine(StubEngine):
    """Answers `text` (finishing with `finish_reason`) and keeps the prompts it is given, as text."""

    context_len = 512

    def __init__(self, text: str, finish_reason: str = "stop"):
        self.tokenizer = build_char_tokenizer()
        self.tokenizer.chat_template = TOOL_TEMPLATE
        self.text, self.finish_reason, self.prompts = text, finish_reason, []

    def submit(self, prompt_ids, params, n=1, owner=None):
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer(self.text, add_special_tokens=False)["input_ids"]
        future = Future()
        future.set_result([Completion(ids, [-0.25] * len(ids), self.text, self.finish_reason, [0] * len(ids))] * n)
        return future


def chat_with_tools(text: str, finish_reason: str = "stop", **fields) -> dict:
    engine = ScriptedEngine(text, finish_reason)
    body = {"messages": [{"role": "user", "content": "12*34"}], "tools": TOOLS} | fields
    (response,) = call([("POST", "/v1/chat/completions", body)], engine)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_tool_call_text_becomes_tool_calls_and_the_tokens_stay_as_sampled():
    choice = chat_with_tools(f"Let me see.\n{CALLS}")
    assert choice["message"] == {"role": "assistant", "content": "Let me see.", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 12, "b": 34}'}},
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
    ]}
    assert choice["finish_reason"] == "tool_calls"
    ids = StubEngine.tokenizer(f"Let me see.\n{CALLS}", add_special_tokens=False)["input_ids"]
    assert choice["token_ids"] == ids and len(choice["logprobs"]["content"]) == len(ids)
    only_calls = chat_with_tools(CALLS, finish_reason="length")
    assert only_calls["message"]["content"] is None and len(only_calls["message"]["tool_calls"]) == 2
    assert only_calls["finish_reason"] == "length"  # cut by max_tokens: not a finished call


def test_tool_calls_are_left_as_text_without_tools_with_tool_choice_none_or_a_malformed_block():
    for text, fields in [(CALLS, {"tool_choice": "none"}), (CALLS, {"tools": None}),
                         (f"{CALLS}<tool_call>{{oops</tool_call>", {"tool_choice": "auto"})]:
        choice = chat_with_tools(text, **fields)
        assert choice["message"] == {"role": "assistant", "content": text} and choice["finish_reason"] == "stop"


def test_tools_and_tool_messages_reach_the_chat_template():
    engine = ScriptedEngine("408")
    messages = [
        {"role": "user", "content": "12*34"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 12, "b": 34}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "multiply", "content": "408"},
    ]
    (response,) = call([("POST", "/v1/chat/completions", {"messages": messages, "tools": TOOLS})], engine)
    assert response.status_code == 200, response.text
    assert engine.prompts == [
        "tool:multiply\n<|im_start|>user\n12*34<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    ]  # arguments sent as a JSON string reach the template as an object, rendered once


@pytest.mark.parametrize(("fields", "message"), [
    ({"tools": "multiply"}, "tools: Input should be a valid list"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name: Field required"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type: Input should be 'function'"),
    ({"tool_choice": "required"}, 'tool_choice must be "auto" or "none"'),
    ({"tool_choice": {"type": "function", "function": {"name": "multiply"}}}, 'tool_choice must be "auto" or "none"'),
    ({"messages": [{"role": "user", "content": None}]}, "content is required"),
    ({"messages": [{"role": "assistant", "content": None}]}, "content is required"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "arguments string is not valid JSON"),
])
def test_bad_tools_tool_choice_and_tool_messages_are_400s(fields, message):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS} | fields
    (response,) = call([("POST", "/v1/chat/completions", body)], ScriptedEngine("x"))
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text


def mixed_logprobs(old_dir, new_dir, prompt_ids: list[int], token_ids: list[int], cut: int) -> torch.Tensor:
    """Logprobs (temperature 1) of `token_ids` when tokens [0, cut) were sampled under the old weights and the rest
    under the new ones, going on from the cache the old weights computed (what an in-flight update gives)."""
    old, new = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval() for d in (old_dir, new_dir))
    ids, split = prompt_ids + token_ids, len(prompt_ids) + cut - 1  # the forward at `split` ran under the new weights
    cache = DynamicCache()
    with torch.no_grad():
        before = old(input_ids=torch.tensor([ids[:split]]), past_key_values=cache, use_cache=True).logits[0]
        after = new(input_ids=torch.tensor([ids[split:-1]]), past_key_values=cache, use_cache=True).logits[0]
    logits = torch.cat([before[len(prompt_ids) - 1:], after])
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(token_ids)[:, None])[:, 0]


@pytest.mark.slow
def test_in_flight_update_switches_running_choices_token_by_token(tiny_model_dir, tmp_path):
    new_dir = save_random_model(tmp_path / "step_5", seed=5, hidden_size=64, num_layers=2)
    engine = Engine(str(tiny_model_dir), context_len=256, seed=0, max_batch_size=16)
    gate = WeightGate()
    app = create_app(engine, "tiny", gate, AccessPolicy(weight_roots=(tmp_path.resolve(), tiny_model_dir.resolve())))
    long = {"prompt": "in flight", "max_tokens": 200, "n": 8, "temperature": 1.0, "seed": 3}

    async def decoding() -> None:
        """Until a sequence of an unfinished request has sampled a few tokens."""
        deadline = time.monotonic() + 30
        while not any(len(seq.token_ids) >= 3 and not seq.request.future.done() for seq in list(engine._seqs)):
            assert time.monotonic() < deadline, "the request never started decoding"
            await asyncio.sleep(0.001)

    async def go():
        async with client_of(app) as client:
            running = asyncio.create_task(client.post("/v1/completions", json=long))
            await decoding()
            update = await client.post("/update_weights", json={"path": str(new_dir), "step": 5, "in_flight": True})
            health = await client.get("/health")
            after = await client.post("/v1/completions", json=long | {"max_tokens": 4})
            response = await running
            # A draining update (the default) waits for a running request: its tokens all have one step.
            drained_request = asyncio.create_task(client.post("/v1/completions", json=long))
            await decoding()
            drained = await client.post("/update_weights", json={"path": str(tiny_model_dir), "step": 6})
            return response, update, health, after, await drained_request, drained

    try:
        response, update, health, after, drained_response, drained = asyncio.run(go())
    finally:
        engine.close()
    assert update.json() == {"weight_step": 5} and health.json()["weight_step"] == 5
    data = response.json()
    assert data["weight_step"] == 0
    cuts = []
    for choice in data["choices"]:
        steps, tokens = choice["token_weight_steps"], choice["token_ids"]
        assert len(steps) == len(tokens) and steps == sorted(steps) and set(steps) <= {0, 5} and steps[0] == 0
        cut = steps.count(0)
        if cut < len(steps):  # still running when the weights changed: later tokens come from the new weights
            cuts.append(cut)
            expected = mixed_logprobs(tiny_model_dir, new_dir, data["prompt_token_ids"], tokens, cut)
            torch.testing.assert_close(torch.tensor(choice["logprobs"]["token_logprobs"]), expected, atol=1e-4, rtol=0)
    assert cuts, "no choice was decoding when the update landed"
    assert after.json()["weight_step"] == 5
    assert all(c["token_weight_steps"] == [5] * len(c["token_ids"]) for c in after.json()["choices"])
    assert drained.json() == {"weight_step": 6} and drained_response.json()["weight_step"] == 5
    assert all(c["token_weight_steps"] == [5] * len(c["token_ids"]) for c in drained_response.json()["choices"])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_too_long_for_the_context_is_refused_before_it_is_tokenized(route):
    """A 4 MiB text prompt was tokenized in full (20 s, +1.6 GB) before the context check refused it. A token
    covers at most as many characters as its longest string (13 for the char tokenizer's specials), so 4 MiB
    of text cannot fit 64 tokens: a 400 without tokenizing, in well under a second."""
    text = "a" * ((4 << 20) - 1024)  # just under the 4 MiB body limit
    body = {"prompt": text} if route == "/v1/completions" else {"messages": [{"role": "user", "content": text}]}
    start = time.perf_counter()
    (answer,) = call([("POST", route, {**body, "max_tokens": 2})])
    assert time.perf_counter() - start < 1.0
    assert answer.status_code == 400, answer.text
    assert "characters, so at least" in answer.json()["error"]["message"]
    assert "exceeds the context length 64" in answer.json()["error"]["message"]


THINKING_TEMPLATE = (  # a variable of the template, as Qwen3's `enable_thinking`; `content` tested as text
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}"
    "{% if 'x' in m['content'] %}{{ '[has x]' }}{% endif %}{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}{{ c['function']['name'] }}{% endfor %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '(no thinking)' }}{% endif %}{% endif %}"
)


def test_chat_template_kwargs_reach_the_template_and_null_content_renders_as_empty():
    engine = ScriptedEngine("ok")
    engine.tokenizer.chat_template = THINKING_TEMPLATE
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    requests = [("POST", "/v1/chat/completions", {"messages": messages, "chat_template_kwargs": kwargs})
                for kwargs in ({"enable_thinking": False}, None)]
    responses = call(requests, engine)
    assert [r.status_code for r in responses] == [200, 200], responses[0].text
    turns = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nf<|im_end|>\n<|im_start|>assistant\n"
    assert sorted(engine.prompts) == [turns, turns + "(no thinking)"]  # the requests run concurrently


@pytest.mark.parametrize("kwargs", [{"chat_template": "{{ 'mine' }}"}, {"tokenize": True},
                                    {"add_generation_prompt": False}])
def test_chat_template_kwargs_cannot_set_renderer_arguments(kwargs):
    engine = ScriptedEngine("ok")
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs}
    (response,) = call([("POST", "/v1/chat/completions", body)], engine)
    assert response.status_code == 400
    assert f"may not set {next(iter(kwargs))}" in response.json()["error"]["message"]
    assert engine.prompts == []


def test_a_tool_call_history_is_refused_when_the_template_drops_the_calls():
    engine = ScriptedEngine("ok")
    engine.tokenizer.chat_template = "{% for m in messages %}{{ m['role'] + ':' + (m['content'] or '') }}{% endfor %}"
    call_message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    plain = {"messages": [{"role": "user", "content": "hi"}]}
    with_calls = {"messages": [{"role": "user", "content": "hi"}, call_message, {"role": "tool", "content": "1"}]}
    refused, served = call([("POST", "/v1/chat/completions", with_calls), ("POST", "/v1/chat/completions", plain)],
                           engine)
    assert served.status_code == 200
    assert refused.status_code == 400 and "does not render assistant tool_calls" in refused.json()["error"]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_the_openai_clients_tool_call_history_round_trips_or_is_refused_in_one_line(request, name):
    """The history an OpenAI client sends after a tool call (assistant `content: null` + `tool_calls` with JSON
    string arguments, then the tool's answer) renders with Qwen3's template; Llama 3's template has no tool calls
    and would drop them silently, so the server refuses it with one line."""
    import openai

    from prime_rl.inference.builtin.engine import Engine

    engine = Engine(str(request.getfixturevalue(f"{name}_tiny_model")), context_len=512, seed=0)
    app = create_app(engine, "tiny", WeightGate())
    call_0 = {"id": "call_0", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 12, "b": 34}'}}
    history = [{"role": "user", "content": "12*34?"}, {"role": "assistant", "content": None, "tool_calls": [call_0]},
               {"role": "tool", "tool_call_id": "call_0", "content": "408"}]

    async def go():
        async with client_of(app) as http:
            client = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="none", http_client=http)
            return await client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=4,
                                                        extra_body={"return_token_ids": True})
    try:
        if name == "llama3":
            with pytest.raises(openai.BadRequestError, match="does not render assistant tool_calls"):
                asyncio.run(go())
            return
        response = asyncio.run(go())
    finally:
        engine.close()
    prompt = engine.tokenizer.decode(response.model_extra["prompt_token_ids"])
    assert '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>' in prompt
    assert prompt.endswith("<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n")

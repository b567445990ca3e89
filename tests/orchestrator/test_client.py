"""The orchestrator's HTTP client against a raw local server: every bad answer is a one-line InferenceError."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator import client as client_module
from prime_rl.orchestrator.client import InferenceClient, InferenceError, RolloutCompletion
from prime_rl.orchestrator.config import ClientConfig

GOOD = (b'{"prompt_token_ids": [1], "weight_step": 3, "choices": [{"index": 0, "token_ids": [5], '
        b'"finish_reason": "stop", "logprobs": {"content": [{"logprob": -1.0}]}}]}')
ANSWERS = {  # what the server sends for a request whose body mentions the key
    "good": (200, GOOD),
    "error": (500, b'{"error": {"message": "engine exploded"}}'),
    "html": (502, b"<html>bad gateway</html>"),
    "invalid": (200, b"{not json"),
    "list": (200, b"[]"),
    "null": (200, b"null"),
}


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            request = await reader.readexactly(length)
            if b"hang" in request:
                await asyncio.sleep(3600)
            status, body = next(answer for key, answer in ANSWERS.items() if key.encode() in request)
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (status, len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass


def chat_as(what: str, timeout_s: float = 5.0):
    """The error (or result) of one chat request whose message is `what`."""

    async def go():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        config = ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=timeout_s, connect_timeout_s=2.0)
        try:
            async with InferenceClient(config) as client:
                return await client.chat([{"role": "user", "content": what}], 1, SamplingRule(), 4)
        except InferenceError as exc:
            return exc
        finally:
            server.close()

    return asyncio.run(go())


def test_a_good_answer_parses():
    result = chat_as("good")
    assert result.weight_step == 3 and result.completions[0].weight_steps == [3]


@pytest.mark.parametrize("what, message", [
    ("error", "answered 500 to .*/v1/chat/completions: engine exploded$"),
    ("html", "answered 502 to .*: <html>bad gateway</html>$"),
    ("invalid", "with no JSON object: b'{not json'$"),
    ("list", r"with no JSON object: b'\[\]'$"),
    ("null", "with no JSON object: b'null'$"),
])
def test_bad_answers_are_one_line_inference_errors(what, message):
    error = chat_as(what)
    assert isinstance(error, InferenceError) and "\n" not in str(error)
    assert re.search(message, str(error)), str(error)


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_a_timeout_naming_the_limit():
    start = time.monotonic()
    error = chat_as("hang", timeout_s=0.5)
    assert isinstance(error, InferenceError) and "did not answer" in str(error) and "within 0.5s" in str(error)
    assert time.monotonic() - start < 5


@pytest.mark.slow
def test_a_connection_that_never_opens_is_retried_then_unreachable(monkeypatch):
    """A listening socket whose accept queue is full drops SYNs: each connect attempt times out. That is a
    connection failure (retried until connect_timeout_s), not a server that did not answer."""
    monkeypatch.setattr(client_module, "CONNECT_ATTEMPT_S", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(s)
    time.sleep(0.1)

    async def go():
        config = ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=600, connect_timeout_s=1.5)
        async with InferenceClient(config) as client:
            with pytest.raises(InferenceError, match=r"unreachable for 1.5s \(ConnectionTimeoutError"):
                await client.chat([{"role": "user", "content": "x"}], 1, SamplingRule(), 4)

    start = time.monotonic()
    try:
        asyncio.run(go())
    finally:
        for s in [*fillers, listener]:
            s.close()
    assert 1.0 < time.monotonic() - start < 6


@pytest.mark.parametrize(("rule", "fields"), [
    (SamplingRule(0.7), {"temperature": 0.7, "top_p": 1.0}),
    (SamplingRule(1.0, top_k=20, top_p=0.9, min_p=0.05),
     {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "min_p": 0.05}),
])
def test_the_sampling_rule_is_what_the_request_asks_for(monkeypatch, rule, fields):
    """top_k and min_p are sent only when on (both backends know them; off they are the servers' defaults)."""
    sent = []

    async def request(self, method, url, payload=None):
        sent.append(payload)
        return json.loads(GOOD)

    monkeypatch.setattr(InferenceClient, "_request", request)
    asyncio.run(InferenceClient(ClientConfig()).chat([{"role": "user", "content": "hi"}], 1, rule, 8))
    body = sent[0]
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p") if k in body} == fields


def test_chat_template_kwargs_are_sent_only_when_set(monkeypatch):
    sent = []

    async def request(self, method, url, payload=None):
        sent.append(payload)
        return json.loads(GOOD)

    monkeypatch.setattr(InferenceClient, "_request", request)
    client = InferenceClient(ClientConfig())
    messages = [{"role": "user", "content": "hi"}]
    asyncio.run(client.chat(messages, 1, SamplingRule(), 8, template_kwargs={"enable_thinking": False}))
    asyncio.run(client.chat(messages, 1, SamplingRule(), 8, template_kwargs={}))
    assert sent[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in sent[1]  # a server that does not know the field never sees it


def choice_json(ids: list[int], steps: list[int], finish: str) -> dict:
    return {"index": 0, "token_ids": ids, "token_weight_steps": steps, "finish_reason": finish, "text": "".join(
        chr(96 + i) for i in ids), "logprobs": {"token_logprobs": [-0.1 * i for i in ids]} if ids else None}


def test_an_aborted_choice_is_resubmitted_with_its_tokens_and_the_pieces_joined(monkeypatch):
    """An in-flight update aborted the answer after 2 tokens (step 3), then its continuation after 1 more (step 4);
    the second continuation runs to its end: one completion whose tokens, logprobs, steps and text are the pieces'
    in order, each continuation asking for the prompt plus every token so far and the tokens left of max_tokens, on
    its own seed stream."""
    sent, answers = [], [
        {"prompt_token_ids": [9, 9], "weight_step": 3, "choices": [choice_json([1, 2], [3, 3], "abort")]},
        {"prompt_token_ids": [9, 9, 1, 2], "weight_step": 4, "choices": [choice_json([3], [4], "abort")]},
        {"prompt_token_ids": [9, 9, 1, 2, 3], "weight_step": 5, "choices": [choice_json([4, 5], [5, 5], "stop")]},
    ]

    async def request(self, method, url, payload=None):
        sent.append((url.rsplit("/", 1)[1], payload))
        return answers[len(sent) - 1]

    monkeypatch.setattr(InferenceClient, "_request", request)
    result = asyncio.run(InferenceClient(ClientConfig()).complete([9, 9], 1, SamplingRule(), 8, seed=11))
    (completion,) = result.completions
    assert completion.token_ids == [1, 2, 3, 4, 5] and completion.weight_steps == [3, 3, 4, 5, 5]
    assert completion.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5])
    assert completion.text == "abcde" and completion.finish_reason == "stop" and result.policy_step(completion) == 3
    assert [(route, body["prompt"], body["max_tokens"], body["n"]) for route, body in sent] == [
        ("completions", [9, 9], 8, 1), ("completions", [9, 9, 1, 2], 6, 1), ("completions", [9, 9, 1, 2, 3], 5, 1)]
    seeds = [body["seed"] for _, body in sent]
    assert seeds == [11, client_module.resubmit_seed(11, 1), client_module.resubmit_seed(11, 2)]
    assert len(set(seeds) | {client_module.call_seed(11, k) for k in range(1, 100)}) == 3 + 99


def test_aborts_at_the_token_limit_before_the_first_token_and_without_end_are_handled(monkeypatch):
    """Aborted with max_tokens sampled: a "length" answer, nothing resubmitted. Aborted before its first token
    (vLLM then gives no logprobs): resubmitted whole. Aborted more than MAX_RESUBMITS times: a one-line
    InferenceError."""
    sent = []

    def serve(answers):
        async def request(self, method, url, payload=None):
            sent.append(payload)
            return answers(len(sent))

        monkeypatch.setattr(InferenceClient, "_request", request)
        return asyncio.run(InferenceClient(ClientConfig()).complete([9], 1, SamplingRule(), 2))

    full = serve(lambda k: {"prompt_token_ids": [9], "choices": [choice_json([1, 2], [0, 0], "abort")]})
    assert full.completions[0].finish_reason == "length" and len(sent) == 1
    sent.clear()
    empty = serve(lambda k: {"prompt_token_ids": [9], "weight_step": k - 1, "choices": [
        choice_json([], [], "abort") if k == 1 else choice_json([1, 2], [1, 1], "stop")]})
    assert empty.completions[0].token_ids == [1, 2] and empty.completions[0].weight_steps == [1, 1]
    assert [body["prompt"] for body in sent] == [[9], [9]]
    sent.clear()
    with pytest.raises(InferenceError, match="aborted by more than 64 weight updates"):
        serve(lambda k: {"prompt_token_ids": [9], "choices": [choice_json([], [], "abort")]})
    assert len(sent) == 1 + client_module.MAX_RESUBMITS


def test_the_aborted_choices_of_one_request_are_resubmitted_on_seed_streams_of_their_own(monkeypatch):
    """n = 2, both choices aborted before their first token: their continuations are the same prompt, so only
    their seeds keep them apart: choice i continues on choice i's own stream (seed + i, as servers seed choice i)."""
    sent = []

    async def request(self, method, url, payload=None):
        sent.append(payload)
        if len(sent) == 1:
            return {"prompt_token_ids": [9], "choices": [choice_json([], [], "abort") | {"index": i} for i in (0, 1)]}
        return {"prompt_token_ids": [9], "choices": [choice_json([1], [1], "stop")]}

    monkeypatch.setattr(InferenceClient, "_request", request)
    result = asyncio.run(InferenceClient(ClientConfig()).complete([9], 2, SamplingRule(), 4, seed=11))
    assert [c.token_ids for c in result.completions] == [[1], [1]]
    assert sorted(body["seed"] for body in sent[1:]) == sorted(
        [client_module.resubmit_seed(11, 1), client_module.resubmit_seed(12, 1)])
    assert len({body["seed"] for body in sent[1:]}) == 2


def test_a_rollout_record_grows_by_sampled_turns_and_context_ids():
    """The one record of a rollout's ids after its prompt: a chat choice (mask None: all sampled) extended by a
    template tail and another call's sample keeps per token its logprob, mask and (sampled ones) weight step."""
    record = RolloutCompletion([5, 6], [-0.5, -0.25], "first", "length", [3, 3])
    record.add_context([9])
    record.add_sampled(RolloutCompletion([7], [-0.125], "<think>x</think>second", "stop", [4]), text="second")
    assert (record.token_ids, record.logprobs, record.mask) == ([5, 6, 9, 7], [-0.5, -0.25, 0.0, -0.125],
                                                                [True, True, False, True])
    assert record.weight_steps == [3, 3, 4] and record.text == "second" and not record.truncated
    empty = RolloutCompletion.empty()
    empty.add_context([])
    assert (empty.token_ids, empty.mask, empty.text, empty.finish_reason) == ([], [], "", "stop")
    empty.add_sampled(record)  # a record with context ids inside keeps them untrained
    assert empty.mask == [True, True, False, True] and empty.weight_steps == [3, 3, 4]


def test_a_cut_keeps_the_weight_steps_of_the_sampled_tokens_before_it():
    """Weight steps are one per sampled token: a cut after context ids keeps as many as were sampled before it."""
    record = RolloutCompletion([5, 6], [-0.5, -0.5], "a", "stop", [1, 1])
    record.add_context([9, 9])
    record.add_sampled(RolloutCompletion([150, 7], [-0.1, -0.1], "b", "stop", [2, 2]))
    record.cut(4)
    assert (record.token_ids, record.mask, record.weight_steps) == ([5, 6, 9, 9], [True, True, False, False], [1, 1])
    plain = RolloutCompletion([5, 150, 7], [-0.1] * 3, "c", "stop", [0, 0, 0])
    plain.cut(1)
    assert (plain.token_ids, plain.logprobs, plain.weight_steps, plain.mask) == ([5], [-0.1], [0], None)

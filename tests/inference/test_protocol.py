"""Request bodies at the boundary: strict JSON and strictly typed fields, so nothing bad reaches the engine."""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError

from prime_rl.openai_api.protocol import (
    INT64_MAX,
    INT64_MIN,
    MAX_JSON_DEPTH,
    ChatRequest,
    CompletionRequest,
    UpdateWeightsRequest,
    parse_json,
)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "malformed JSON body"),
        (b'{"temperature": NaN}', "NaN is not valid JSON"),
        (b'{"temperature": Infinity}', "Infinity is not valid JSON"),
        (b'{"temperature": -Infinity}', "-Infinity is not valid JSON"),
        (b'{"temperature": 1e400}', "out of range"),
        (b'{"prompt": "\\ud800"}', "lone UTF-16 surrogate"),
        (b'{"prompt": "ok \\udc00 then"}', "lone UTF-16 surrogate"),
        (b'{"\\ud800": 1}', "lone UTF-16 surrogate"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than"),
        (b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), "nested deeper than"),
        (b'{"seed": 1' + b"0" * 5000 + b"}", "malformed JSON body"),  # beyond Python's int-parsing limit
        (b'"\xff"', "not UTF-8"),
    ],
)
def test_strict_json_refuses_with_one_line(raw, message):
    with pytest.raises(ValueError) as caught:
        parse_json(raw)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_strict_json_accepts_what_clients_send():
    assert parse_json(b'{"prompt": "\\ud83d\\ude00", "t": 1e-300}') == {"prompt": "\U0001F600", "t": 1e-300}
    deepest = b'{"a": ' * (MAX_JSON_DEPTH - 1) + b"1" + b"}" * (MAX_JSON_DEPTH - 1)
    assert parse_json(deepest) is not None


def test_seed_range_is_exactly_int64_and_every_accepted_seed_works():
    for seed in (INT64_MIN, -1, 0, INT64_MAX):
        body = CompletionRequest.model_validate({"prompt": "a", "seed": seed, "n": 1024})
        for i in (0, body.n - 1):  # choice i samples with seed + i
            torch.Generator().manual_seed(body.seed + i)
    for seed in (INT64_MAX + 1, INT64_MIN - 1, 2**64, -(2**64)):
        with pytest.raises(ValidationError, match="seed"):
            CompletionRequest.model_validate({"prompt": "a", "seed": seed})


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": -1}, {"temperature": float("nan")}, {"temperature": float("inf")}, {"temperature": "0.5"},
        {"temperature": True}, {"top_p": 0}, {"top_p": 1.5}, {"top_p": float("nan")}, {"top_k": -2},
        {"top_k": 1.5}, {"min_p": -0.1}, {"min_p": 1.5}, {"min_p": float("nan")}, {"min_p": "0.1"}, {"n": 0},
        {"n": 1025}, {"n": True}, {"n": "2"}, {"n": 2.5}, {"max_tokens": 0},
        {"max_tokens": -1}, {"max_tokens": "8"}, {"seed": 1.5}, {"seed": "1"}, {"seed": False},
        {"prompt": 5}, {"prompt": ""}, {"prompt": []}, {"prompt": [1, "2"]}, {"prompt": [1, True]},
        {"stream": True}, {"echo": True}, {"top_logprobs": 2}, {"logprobs": 5},
    ],
)
def test_bad_completion_fields_are_validation_errors(fields):
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"prompt": "a", **fields})


def test_bad_chat_and_update_bodies_are_validation_errors():
    for body in ({"messages": []}, {"messages": "hi"}, {"messages": [{"role": "user"}]},
                 {"messages": [{"role": "user", "content": 5}]}, {"messages": [{"role": "user", "content": "a"}],
                                                                  "max_completion_tokens": 0}):
        with pytest.raises(ValidationError):
            ChatRequest.model_validate(body)
    for body in ({}, {"path": ""}, {"path": 5}, {"path": "/x", "step": -1}, {"path": "/x", "step": 2**63},
                 {"path": "/x", "other": 1}):
        with pytest.raises(ValidationError):
            UpdateWeightsRequest.model_validate(body)


def test_valid_bodies_keep_their_values():
    body = CompletionRequest.model_validate(json.loads('{"prompt": [1, 2], "temperature": 0, "top_k": 0, "n": 3}'))
    assert (body.prompt, body.temperature, body.top_k, body.n) == ([1, 2], 0.0, 0, 3)
    chat = ChatRequest.model_validate({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 4})
    assert chat.max_tokens == 4

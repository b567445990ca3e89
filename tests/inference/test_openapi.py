"""The builtin server's /openapi.json declares what every route takes and answers, as the handlers validate it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from prime_rl.inference.builtin.app import create_app
from prime_rl.inference.gate import WeightGate
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.protocol import ChatRequest, CompletionRequest, ResetRequest, UpdateWeightsRequest
from tests.inference.builtin.test_app import StubEngine

BODIES = {"/v1/chat/completions": ChatRequest, "/v1/completions": CompletionRequest,
          "/update_weights": UpdateWeightsRequest, "/reset": ResetRequest}


def served_document(engine=None) -> dict:
    app = create_app(engine or StubEngine(), "stub", WeightGate(), AccessPolicy(api_key="k"))

    async def get():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            refused = await client.get("/openapi.json")
            served = await client.get("/openapi.json", headers={"authorization": "Bearer k"})
            return refused, served

    refused, served = asyncio.run(get())
    assert refused.status_code == 401  # the document is behind the key, as every route but /health
    return served.json()


@pytest.fixture(scope="module")
def document() -> dict:
    return served_document()


def resolve(document: dict, schema: dict) -> dict:
    return document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]


def test_every_post_route_declares_its_body_model_with_every_field(document):
    """The handlers read the raw body (strict JSON, off the event loop), so FastAPI alone listed no request body;
    each POST route now names its model and the document holds every field the model validates."""
    for path, model in BODIES.items():
        body = document["paths"][path]["post"]["requestBody"]
        assert body["required"]
        schema = resolve(document, body["content"]["application/json"]["schema"])
        assert set(schema.get("properties", {})) == set(model.model_fields), path
    for path in ("/health", "/v1/models"):
        assert "requestBody" not in document["paths"][path]["get"]


def test_every_route_declares_the_error_shape_and_the_key(document):
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for status in ("400", "401", "403", "404", "413", "415", "500", "503"):
                schema = operation["responses"][status]["content"]["application/json"]["schema"]
                assert set(resolve(document, schema)["properties"]) == {"error"}, (path, status)
            assert operation["security"] == ([] if path == "/health" else [{"apiKey": []}])
    assert document["components"]["securitySchemes"]["apiKey"] == {"type": "http", "scheme": "bearer"}


def test_the_schema_states_the_servers_own_bounds(document):
    """Token ids below the served vocabulary, max_tokens below the context, what the builtin backend refuses
    (echo, stream, top alternatives, prompt_logprobs on chat) as constants."""
    schemas = document["components"]["schemas"]
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    assert prompt[1]["items"] == {"type": "integer", "minimum": 0, "maximum": StubEngine.vocab - 1}
    assert prompt[2]["items"]["items"]["maximum"] == StubEngine.vocab - 1
    max_tokens = schemas["ChatRequest"]["properties"]["max_tokens"]["anyOf"][0]
    assert max_tokens["maximum"] == StubEngine.context_len - 1
    assert schemas["CompletionRequest"]["properties"]["echo"]["const"] is False
    assert schemas["ChatRequest"]["properties"]["stream"]["const"] is False
    assert schemas["ChatRequest"]["properties"]["prompt_logprobs"]["type"] == "null"
    assert schemas["ChatRequest"]["properties"]["tool_choice"]["enum"] == ["auto", "none", None]


def test_messages_may_carry_tool_calls_only_where_the_template_renders_them(document):
    """The char tokenizer's template drops tool calls (a tool-call history is a 400 there): its document says
    a message has text content and no calls."""
    message = document["components"]["schemas"]["ChatMessage"]
    assert message["properties"]["tool_calls"] == {"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}
    assert "content" in message["required"] and "anyOf" not in message


@pytest.mark.parametrize(("body", "accepted"), [
    ({"path": "x", "step": 2.0}, True),  # JSON Schema's integer: 2.0 is one
    ({"path": "x", "step": 2.5}, False),
    ({"path": "x", "step": True}, False),
    ({"path": "x", "step": "2"}, False),
])
def test_integers_are_what_json_schema_calls_integers(body, accepted):
    try:
        UpdateWeightsRequest.model_validate(body)
    except ValueError:
        assert not accepted
    else:
        assert accepted

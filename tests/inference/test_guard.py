"""`guard.RequestGuard`: API key, admin-endpoint Host and Content-Type checks, body cap (both backends)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.guard import RequestGuard, host_allowed

KEY = "s3cret-key"


async def echo_app(scope, receive, send):
    """Answers 200 with the size of the body it received."""
    size = 0
    while True:
        message = await receive()
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = json.dumps({"path": scope["path"], "size": size}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def call(access: AccessPolicy, requests: list[dict], base_url: str = "http://127.0.0.1:8000") -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=RequestGuard(echo_app, access))
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            return [await client.request(**request) for request in requests]

    return asyncio.run(go())


def assert_error(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["code"] == status and error["type"].endswith("Error")


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def test_the_api_key_is_needed_everywhere_but_health():
    access = AccessPolicy(api_key=KEY)
    missing, wrong, basic, health, unknown, ok, lower = call(access, [
        {"method": "POST", "url": "/v1/completions", "json": {}},
        {"method": "GET", "url": "/v1/models", "headers": bearer("nope")},
        {"method": "GET", "url": "/v1/models", "headers": {"authorization": f"Basic {KEY}"}},
        {"method": "GET", "url": "/health"},
        {"method": "GET", "url": "/no/such/route"},
        {"method": "POST", "url": "/update_weights", "json": {}, "headers": bearer(KEY)},
        {"method": "GET", "url": "/v1/models", "headers": {"authorization": f"bearer {KEY}"}},
    ])
    for response in (missing, wrong, basic, unknown):
        assert_error(response, 401, "missing or wrong API key")
        assert response.headers["www-authenticate"] == "Bearer"
        assert KEY not in response.text
    assert health.status_code == 200 and ok.status_code == 200 and lower.status_code == 200
    assert call(AccessPolicy(), [{"method": "GET", "url": "/v1/models"}])[0].status_code == 200  # no key: open


def test_admin_endpoints_need_json_and_this_servers_host():
    access = AccessPolicy()
    for path in ("/update_weights", "/reset"):
        plain, none, rebound, good, charset = call(access, [
            {"method": "POST", "url": path, "content": b"{}", "headers": {"content-type": "text/plain"}},
            {"method": "POST", "url": path, "content": b"{}"},
            {"method": "POST", "url": path, "json": {}, "headers": {"host": "evil.example:8000"}},
            {"method": "POST", "url": path, "json": {}},
            {"method": "POST", "url": path, "content": b"{}",
             "headers": {"content-type": "application/json; charset=utf-8"}},
        ])
        assert_error(plain, 415, "Content-Type: application/json")
        assert_error(none, 415, "Content-Type: application/json")
        assert_error(rebound, 403, "evil.example")
        assert good.status_code == 200 and charset.status_code == 200
    # Other routes take any content type (only admin endpoints change state).
    assert call(access, [{"method": "POST", "url": "/v1/completions", "content": b"{}"}])[0].status_code == 200


@pytest.mark.parametrize(
    ("bound", "allowed", "host", "ok"),
    [
        ("127.0.0.1", (), "127.0.0.1:8000", True),
        ("127.0.0.1", (), "localhost:8000", True),
        ("127.0.0.1", (), "LOCALHOST", True),
        ("127.0.0.1", (), "[::1]:8000", True),
        ("127.0.0.1", (), "127.0.0.2", True),  # any loopback address
        ("127.0.0.1", (), "evil.example", False),
        ("127.0.0.1", (), "localhost.evil.example", False),
        ("127.0.0.1", (), "10.0.0.5:8000", False),
        ("127.0.0.1", (), "", False),
        ("127.0.0.1", (), None, False),
        ("10.0.0.5", (), "10.0.0.5:8000", True),
        ("10.0.0.5", (), "10.0.0.6:8000", False),
        ("0.0.0.0", (), "10.0.0.6:8000", True),  # bound everywhere: any address, never a name
        ("0.0.0.0", (), "[fe80::1]:8000", True),
        ("0.0.0.0", (), "gpu-node-3:8000", False),
        ("0.0.0.0", ("gpu-node-3",), "GPU-node-3:8000", True),
    ],
)
def test_host_names_admin_endpoints_accept(bound, allowed, host, ok):
    assert host_allowed(host, AccessPolicy(host=bound, allowed_hosts=allowed)) is ok


def test_bodies_beyond_the_cap_are_413_from_the_header_or_while_read():
    access = AccessPolicy(max_request_bytes=100)
    declared, exact, bad_length = call(access, [
        {"method": "POST", "url": "/v1/completions", "content": b"x" * 101},
        {"method": "POST", "url": "/v1/completions", "content": b"x" * 100},
        {"method": "POST", "url": "/v1/completions", "content": b"x", "headers": {"content-length": "1x"}},
    ])
    assert_error(declared, 413, "exceeds the limit of 100 bytes")
    assert exact.status_code == 200 and exact.json()["size"] == 100
    assert_error(bad_length, 400, "Content-Length")

    async def streamed(chunks: list[bytes]):
        """A body sent in chunks without Content-Length (chunked transfer)."""
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        sent = []

        async def receive():
            return messages.pop(0)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
        await RequestGuard(echo_app, access)(scope, receive, send)
        return sent[0]["status"], json.loads(sent[1]["body"]), messages

    status, body, unread = asyncio.run(streamed([b"x" * 60, b"x" * 60, b"x" * 60]))
    assert status == 413 and "exceeds the limit" in body["error"]["message"]
    assert len(unread) == 1  # stopped reading at the chunk that crossed the cap
    status, body, _ = asyncio.run(streamed([b"x" * 50, b"x" * 50]))
    assert status == 200 and body["size"] == 100


@pytest.mark.parametrize(("key", "why"), [
    ("", "the API key is empty"),
    ("clé-secrète", "must be printable ASCII"),
    ("tab\tinside", "must be printable ASCII"),
    (" padded", "must not begin or end with a space"),
    ("padded ", "must not begin or end with a space"),
])
def test_an_api_key_no_client_could_send_is_a_load_error(monkeypatch, capsys, key, why):
    """The header is read as latin-1 and compared as bytes: such a key would lock every client out (or, empty,
    silently turn authentication off)."""
    from prime_rl.configs.cli import parse_config
    from prime_rl.inference.config import InferenceConfig
    from prime_rl.orchestrator.config import OrchestratorConfig

    for config_cls, env, field in ((InferenceConfig, "PRIME_API_KEY", "api_key"),
                                   (OrchestratorConfig, "PRIME_CLIENT__API_KEY", "client.api_key")):
        monkeypatch.setenv(env, key)
        with pytest.raises(SystemExit) as exit_info:
            parse_config(config_cls, ["--dry-run"])
        monkeypatch.delenv(env)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"invalid value for '{field}': " in err and why in err, err
        assert not key.strip() or key.strip() not in err  # the key itself is never printed


def test_a_printable_ascii_api_key_loads():
    from prime_rl.inference.config import InferenceConfig
    from prime_rl.orchestrator.config import ClientConfig

    key = "sk-" + "".join(chr(c) for c in range(0x21, 0x7F)) + " inner space"
    assert InferenceConfig(api_key=key).api_key.get_secret_value() == key
    assert ClientConfig(api_key=key).api_key.get_secret_value() == key

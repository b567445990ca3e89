"""The checks every request passes before a route sees it (builtin app and vLLM middleware alike).

In this order, each answered with a JSON error body:

1. API key (when the access policy has one): every endpoint but `GET /health` needs
   `Authorization: Bearer <key>`; otherwise 401.
2. Admin endpoints (`POST /update_weights`, `POST /reset`): the `Host` header must name
   this server (localhost, a loopback address, the bound address, an `allowed_hosts`
   name, or any IP address when bound to all interfaces), otherwise 403: a web page
   reaching the server through DNS rebinding sends its own domain name. The body must be
   `Content-Type: application/json`, otherwise 415: a browser sends that type
   cross-origin only after a CORS preflight, which this server never grants.
3. Body size: a `Content-Length` above `max_request_bytes`, or a body that grows past
   it while it is read, is a 413. The body of a POST is read here whole (at most the
   cap) and handed on to the route.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from http import HTTPStatus

from prime_rl.openai_api.access import AccessPolicy

ADMIN_PATHS = frozenset({"/update_weights", "/reset"})
OPEN_PATHS = frozenset({"/health"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


class BodyTooLarge(Exception):
    """The request body grew past the cap while it was read."""


def error_payload(status: int, message: str) -> dict:
    """The error body of every non-2xx answer: `{"error": {"message", "type", "code"}}`."""
    kind = "".join(HTTPStatus(status).phrase.split())
    return {"error": {"message": message, "type": kind if kind.endswith("Error") else f"{kind}Error", "code": status}}


async def send_json(send, status: int, payload: dict, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = json.dumps(payload).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


async def send_error(send, status: int, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """Answer with `error_payload(status, message)` (the raw-ASGI twin of the builtin app's JSONResponse)."""
    await send_json(send, status, error_payload(status, message), headers)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def authorized(scope, api_key: str | None) -> bool:
    """True when no key is set or the request carries `Authorization: Bearer <key>` (constant-time compare)."""
    if not api_key:
        return True
    scheme, _, token = (_header(scope, b"authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def host_name(header: str) -> str:
    """`name` of a Host header `name`, `name:port`, `[v6]` or `[v6]:port`, lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def host_allowed(header: str | None, access: AccessPolicy) -> bool:
    """Whether a Host header names this server (see the module docstring)."""
    if not header:
        return False
    name = host_name(header)
    if name in ("localhost", access.host.lower()) or name in {h.lower() for h in access.allowed_hosts}:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_loopback or access.host in WILDCARD_HOSTS


def is_json(content_type: str | None) -> bool:
    return (content_type or "").partition(";")[0].strip().lower() == "application/json"


def refusal(scope, access: AccessPolicy) -> tuple[int, str] | None:
    """(status, message) when the request's headers already refuse it, else None."""
    path, method = scope["path"], scope["method"]
    if path not in OPEN_PATHS and not authorized(scope, access.api_key):
        return 401, "missing or wrong API key: send 'Authorization: Bearer <key>'"
    if method == "POST" and path in ADMIN_PATHS:
        host = _header(scope, b"host")
        if not host_allowed(host, access):
            return 403, f"{path} refuses the Host header {(host or '')[:100]!r} (not this server)"
        if not is_json(_header(scope, b"content-type")):
            return 415, f"{path} needs 'Content-Type: application/json'"
    length = _header(scope, b"content-length")
    if length is not None:
        if not length.strip().isdigit():
            return 400, f"invalid Content-Length {length!r}"
        if int(length) > access.max_request_bytes:
            return 413, f"request body of {int(length)} bytes exceeds the limit of {access.max_request_bytes} bytes"
    return None


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; BodyTooLarge as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def replay(body: bytes, receive):
    """A `receive` that hands the app the already-read body, then the client's later messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


class RequestGuard:
    """Pure ASGI wrapper applying `refusal` and the body cap before `app` runs."""

    def __init__(self, app, access: AccessPolicy):
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = refusal(scope, self.access)
        if refused is not None:
            status, message = refused
            extra = ((b"www-authenticate", b"Bearer"),) if status == 401 else ()
            return await send_error(send, status, message, extra)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body = await read_body(receive, self.access.max_request_bytes)
            except BodyTooLarge:
                message = f"request body exceeds the limit of {self.access.max_request_bytes} bytes"
                return await send_error(send, 413, message)
            receive = replay(body, receive)
        return await self.app(scope, receive, send)

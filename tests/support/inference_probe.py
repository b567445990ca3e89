"""A bad-request probe for a running inference server (builtin or vLLM): every request must get a
4xx with a JSON error body, the server must keep serving, and an innocent request running at the
same time must get exactly the answer it gets alone.

    python tests/support/inference_probe.py http://127.0.0.1:8000 --api-key KEY --weight-root DIR --model-dir DIR

Loopback only; every request has a timeout. The test `tests/inference/test_server_under_attack.py`
runs it against the builtin server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TIMEOUT_S = 60
SEED_EDGES = (2**64, 2**63, -(2**63) - 1, 10**30)


@dataclass
class Probe:
    name: str
    method: str
    path: str
    body: Any = None  # dict/list: sent as JSON; bytes: sent as is; None: no body
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None  # the exact status expected; None: any 4xx
    auth: bool = True  # send the API key


def _completion(**fields) -> dict:
    return {"prompt": "abc", "max_tokens": 4, **fields}


def request_probes() -> list[Probe]:
    """Bad bodies, fields, headers, sizes and routes (no weight directories needed)."""
    json_type = {"content-type": "application/json"}
    probes = [
        Probe("no API key", "POST", "/v1/completions", _completion(), status=401, auth=False),
        Probe("wrong API key", "POST", "/v1/completions", _completion(), {"authorization": "Bearer wrong"}, 401),
        Probe("API key as Basic", "GET", "/v1/models", None, {"authorization": "Basic x"}, 401),
        Probe("malformed JSON", "POST", "/v1/completions", b"{not json", json_type, 400),
        Probe("JSON array body", "POST", "/v1/completions", [1, 2], None, 400),
        Probe("empty body", "POST", "/v1/chat/completions", b"", json_type, 400),
        Probe("not UTF-8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', json_type, 400),
        Probe("nested 100k deep", "POST", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, json_type, 400),
        Probe("nested object 100k deep", "POST", "/v1/chat/completions",
              b'{"a":' * 100_000 + b"1" + b"}" * 100_000, json_type, 400),
        Probe("lone surrogate in prompt", "POST", "/v1/completions", b'{"prompt": "a\\ud800b"}', json_type, 400),
        Probe("lone surrogate in messages", "POST", "/v1/chat/completions",
              b'{"messages": [{"role": "user", "content": "\\udfff"}]}', json_type, 400),
        Probe("lone surrogate in stop", "POST", "/v1/completions", b'{"prompt": "a", "stop": ["\\ud800"]}',
              json_type, 400),
        Probe("prompt is a number", "POST", "/v1/completions", {"prompt": 5}, status=400),
        Probe("prompt token id negative", "POST", "/v1/completions", {"prompt": [1, -1]}, status=400),
        Probe("prompt token id huge", "POST", "/v1/completions", {"prompt": [10**30]}, status=400),
        Probe("messages is a string", "POST", "/v1/chat/completions", {"messages": "hi"}, status=400),
        Probe("message without content", "POST", "/v1/chat/completions", {"messages": [{"role": "user"}]}, status=400),
        Probe("model is a number", "POST", "/v1/completions", _completion(model=5), status=400),
        Probe("unknown model", "POST", "/v1/completions", _completion(model="other"), status=404),
        Probe("n is a string", "POST", "/v1/completions", _completion(n="two"), status=400),
        Probe("n is true", "POST", "/v1/completions", _completion(n=True), status=400),
        Probe("max_tokens is a string", "POST", "/v1/completions", _completion(max_tokens="8"), status=400),
        Probe("temperature is a string", "POST", "/v1/completions", _completion(temperature="hot"), status=400),
        Probe("temperature NaN", "POST", "/v1/completions", b'{"prompt": "a", "temperature": NaN}', json_type, 400),
        Probe("temperature Infinity", "POST", "/v1/completions", b'{"prompt": "a", "temperature": Infinity}',
              json_type, 400),
        Probe("temperature 1e999", "POST", "/v1/completions", b'{"prompt": "a", "temperature": 1e999}', json_type, 400),
        Probe("temperature -1", "POST", "/v1/completions", _completion(temperature=-1), status=400),
        Probe("top_p 0", "POST", "/v1/completions", _completion(top_p=0), status=400),
        Probe("top_p 1.5", "POST", "/v1/completions", _completion(top_p=1.5), status=400),
        Probe("top_p -Infinity", "POST", "/v1/completions", b'{"prompt": "a", "top_p": -Infinity}', json_type, 400),
        Probe("top_k -2", "POST", "/v1/completions", _completion(top_k=-2), status=400),
        Probe("top_k 1.5", "POST", "/v1/completions", _completion(top_k=1.5), status=400),
        Probe("n 0", "POST", "/v1/completions", _completion(n=0), status=400),
        Probe("n 100000", "POST", "/v1/completions", _completion(n=100_000), status=400),
        Probe("max_tokens 0", "POST", "/v1/completions", _completion(max_tokens=0), status=400),
        Probe("max_tokens -1", "POST", "/v1/completions", _completion(max_tokens=-1), status=400),
        Probe("max_tokens 10**20", "POST", "/v1/completions", _completion(max_tokens=10**20), status=400),
        Probe("max_completion_tokens 0", "POST", "/v1/chat/completions",
              {"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0}, status=400),
        Probe("empty stop string", "POST", "/v1/completions", _completion(stop=[""]), status=400),
        Probe("seed 1.5", "POST", "/v1/completions", _completion(seed=1.5), status=400),
        Probe("seed with 5000 digits", "POST", "/v1/completions", b'{"prompt": "a", "seed": 1' + b"0" * 5000 + b"}",
              json_type, 400),
        *[Probe(f"seed {seed}", "POST", "/v1/completions", _completion(seed=seed), status=400) for seed in SEED_EDGES],
        Probe("oversized body", "POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 * 2**20) + b'"}', json_type,
              413),
        Probe("update with text/plain", "POST", "/update_weights", b'{"path": "/x"}', {"content-type": "text/plain"},
              415),
        Probe("update without content type", "POST", "/update_weights", b'{"path": "/x"}', None, 415),
        Probe("reset with form data", "POST", "/reset", b"a=1", {"content-type": "application/x-www-form-urlencoded"},
              415),
        Probe("update through a rebound Host", "POST", "/update_weights", {"path": "/x"}, {"host": "evil.example"},
              403),
        Probe("reset through a rebound Host", "POST", "/reset", {}, {"host": "attacker.example:8000"}, 403),
        Probe("unknown route", "GET", "/v2/nothing", status=404),
        Probe("unknown route, POST", "POST", "/admin", {}, status=404),
        Probe("wrong method on completions", "DELETE", "/v1/completions", status=405),
        Probe("wrong method on update", "GET", "/update_weights", status=405),
        Probe("wrong method on reset", "PUT", "/reset", {}, status=405),
    ]
    return probes


def weight_probes(weight_root: Path, outside: Path, mismatched: dict[str, tuple[Path, str]]) -> list[Probe]:
    """Weight paths outside the allowed root (403) and directories that do not fit the model (400).

    `weight_root` is the server's allowed root, `outside` a real weight directory outside it.
    """
    link = weight_root / "link_out"
    if not link.is_symlink():
        link.symlink_to(outside)
    probes = [
        Probe("weights outside the root", "POST", "/update_weights", {"path": str(outside)}, status=403),
        Probe("weights /etc", "POST", "/update_weights", {"path": "/etc"}, status=403),
        Probe("traversal with ..", "POST", "/update_weights",
              {"path": f"{weight_root}/../../../../../../{str(outside).lstrip('/')}"}, status=403),
        Probe("relative traversal", "POST", "/update_weights", {"path": "../../../../../../etc"}, status=403),
        Probe("symlink leading out", "POST", "/update_weights", {"path": str(link)}, status=403),
        Probe("NUL byte in path", "POST", "/update_weights", {"path": f"{weight_root}/step_1\x00"}, status=400),
        Probe("missing dir inside the root", "POST", "/update_weights", {"path": str(weight_root / "step_404")},
              status=400),
        Probe("the root itself", "POST", "/update_weights", {"path": str(weight_root)}, status=400),
        Probe("path is a number", "POST", "/update_weights", {"path": 5}, status=400),
        Probe("negative step", "POST", "/update_weights", {"path": str(weight_root), "step": -1}, status=400),
        Probe("unknown update field", "POST", "/update_weights", {"path": str(weight_root), "code": "x"}, status=400),
    ]
    probes += [Probe(f"weights: {name}", "POST", "/update_weights", {"path": str(path)}, status=400)
               for name, (path, _) in mismatched.items()]
    return probes


async def send(client: httpx.AsyncClient, probe: Probe, api_key: str | None) -> httpx.Response:
    headers = dict(probe.headers or {})
    if probe.auth and api_key and "authorization" not in headers:
        headers["authorization"] = f"Bearer {api_key}"
    if isinstance(probe.body, bytes):
        return await client.request(probe.method, probe.path, content=probe.body, headers=headers)
    if probe.body is None:
        return await client.request(probe.method, probe.path, headers=headers)
    return await client.request(probe.method, probe.path, json=probe.body, headers=headers)


def verdict(probe: Probe, response: httpx.Response) -> str | None:
    """What is wrong with the answer to `probe`, or None."""
    wanted = probe.status if probe.status is not None else "4xx"
    if not 400 <= response.status_code < 500 or (probe.status is not None and response.status_code != probe.status):
        return f"{probe.name}: expected {wanted}, got {response.status_code}: {response.text[:200]}"
    try:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and error["code"] == response.status_code
    except Exception:
        return f"{probe.name}: the {response.status_code} body is not a JSON error: {response.text[:200]}"
    return None


INNOCENT = {"prompt": "an innocent request", "max_tokens": 200, "temperature": 1.0, "seed": 3, "n": 2}


async def probe_server(url: str, probes: list[Probe], api_key: str | None = None) -> list[str]:
    """Send every probe while an innocent seeded request runs; return the problems found (none: [])."""
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    problems = []
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S) as client:
        innocent = asyncio.create_task(client.post("/v1/completions", json=INNOCENT, headers=auth))
        answers = await asyncio.gather(*(send(client, probe, api_key) for probe in probes))
        problems += [p for p in (verdict(probe, r) for probe, r in zip(probes, answers, strict=True)) if p]
        during = await innocent
        alone = await client.post("/v1/completions", json=INNOCENT, headers=auth)
        health = await client.get("/health")
    if during.status_code != 200:
        return [*problems, f"the innocent request failed: {during.status_code} {during.text[:200]}"]
    first, again = during.json(), alone.json()
    for key in ("weight_step", "prompt_token_ids"):
        if first[key] != again[key]:
            problems.append(f"the innocent request's {key} changed: {first[key]} vs {again[key]}")
    for choice, same in zip(first["choices"], again["choices"], strict=True):
        if choice["token_ids"] != same["token_ids"]:
            problems.append("the innocent request's tokens differ from the same request sent alone")
        logprobs = choice["logprobs"]["token_logprobs"]
        if not all(math.isfinite(lp) and lp <= 0 for lp in logprobs):
            problems.append(f"the innocent request has non-finite logprobs: {logprobs[:5]}")
    if health.status_code != 200:
        problems.append(f"/health answered {health.status_code} after the probe")
    return problems


def main() -> None:  # pragma: no cover - manual use
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--api-key", default=os.environ.get("PRIME_API_KEY"))
    parser.add_argument("--weight-root", type=Path, help="the server's allowed weight directory (adds weight probes)")
    parser.add_argument("--outside", type=Path, help="a weight directory outside the root")
    args = parser.parse_args()
    probes = request_probes()
    if args.weight_root and args.outside:
        probes += weight_probes(args.weight_root, args.outside, {})
    problems = asyncio.run(probe_server(args.url, probes, args.api_key))
    print(json.dumps({"probes": len(probes), "problems": problems}, indent=1))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

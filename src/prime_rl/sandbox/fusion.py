"""A SandboxFusion server as the sandbox (`sandbox = "sandbox_fusion"`, `url = ...`): each case is one
`POST {url}/run_code` with {"code", "language": "python", "stdin", "run_timeout", "compile_timeout",
"memory_limit_MB"}; the reply's `run_result` {"status", "return_code", "stdout", "stderr", "execution_time"} becomes
a `CaseResult`. The server does the isolation; this side adds the same case kinds as the local harness:
a call or assert case is the solution followed by a footer that prints a marker line (a random nonce per case)
and the value (call) or `true` (assert) after the test code ran to its end.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from prime_rl.sandbox.limits import CaseResult, Limits
from prime_rl.sandbox.local import SandboxFailed
from prime_rl.utils.errors import UserError
from prime_rl.utils.loop_limit import LoopLimit

_LOAD = """import json as _prime_json
_prime_ns = {{"__name__": "solution", "__file__": "solution.py"}}
exec(compile({solution!r}, "solution.py", "exec"), _prime_ns)
"""
_CALL = """_prime_fn = _prime_ns.get({fn!r}) or getattr(_prime_ns["Solution"](), {fn!r})
_prime_value = _prime_fn(*_prime_json.loads({args!r}))
_prime_sets = lambda o: sorted(o) if isinstance(o, (set, frozenset)) else repr(o)
print("\\n{marker}" + _prime_json.dumps(_prime_value, default=_prime_sets))
"""
_ASSERT = """exec(compile({code!r}, "tests.py", "exec"), _prime_ns)
print("\\n{marker}true")
"""


def fusion_program(solution: str, case: dict[str, Any], marker: str) -> str:
    """The program one case sends: the solution itself (stdio), or the solution loaded as a module named
    "solution" (its `if __name__ == "__main__"` part does not run, as in the local harness) and the footer."""
    if case["kind"] == "stdio":
        return solution
    footer = (_CALL.format(fn=case["fn"], args=case["args"], marker=marker) if case["kind"] == "call"
              else _ASSERT.format(code=case["code"], marker=marker))
    return _LOAD.format(solution=solution) + footer


def fusion_result(reply: dict[str, Any], kind: str, marker: str, limits: Limits) -> CaseResult:
    """A CaseResult from a /run_code reply; SandboxFailed for a reply the server marks as its own error."""
    if reply.get("status") == "SandboxError":
        raise SandboxFailed(f"SandboxFusion: {str(reply.get('message', ''))[:200]}")
    run = reply.get("run_result") or {}
    compile_result = reply.get("compile_result") or {}
    if compile_result.get("status") not in (None, "Finished") or (
            compile_result.get("return_code") not in (None, 0)):
        return CaseResult("compile_error", compile_result.get("return_code"), "", "",
                          str(compile_result.get("stderr", ""))[-4096:])
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")[-4096:]
    seconds = float(run.get("execution_time") or 0.0)
    if run.get("status") == "TimeLimitExceeded":
        return CaseResult("timeout", run.get("return_code"), "", "", stderr, seconds)
    code = run.get("return_code")
    if len(stdout.encode()) > limits.output_kib << 10:
        return CaseResult("output_limit", code, stdout[:limits.output_kib << 10], "", stderr, seconds)
    result = ""
    if kind != "stdio":
        head, found, tail = stdout.rpartition(marker)
        stdout, result = (head, tail.strip()) if found else (stdout, "")
    status = "ok" if code == 0 and (kind == "stdio" or result) else "error"
    return CaseResult(status, code, stdout, result, stderr, seconds)


class FusionSandbox:
    """Cases through a SandboxFusion server, at most `max_concurrency` requests at once; a server that cannot be
    reached, answers with an error status or times out: `SandboxFailed` (the rollout fails under `on_error`)."""

    def __init__(self, url: str, limits: Limits | None = None, max_concurrency: int = 4,
                 transport: httpx.AsyncBaseTransport | None = None):
        if not url.startswith(("http://", "https://")):
            raise UserError(f"sandbox_fusion url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") + "/run_code"
        self.limits = limits or Limits()
        self._limit = LoopLimit(max_concurrency)
        self._transport = transport

    async def run(self, solution: str, cases: Sequence[dict[str, Any]]) -> AsyncIterator[CaseResult]:
        async with httpx.AsyncClient(transport=self._transport, timeout=self.limits.timeout_s + 30) as client:
            for case in cases:
                marker = f"__prime_rl_{secrets.token_hex(8)}__"
                body = {"code": fusion_program(solution, case, marker), "language": "python",
                        "stdin": case.get("stdin", ""), "run_timeout": self.limits.timeout_s,
                        "compile_timeout": self.limits.timeout_s, "memory_limit_MB": self.limits.memory_mib}
                async with self._limit():
                    try:
                        response = await client.post(self.url, json=body)
                        response.raise_for_status()
                        reply = response.json()
                    except (httpx.HTTPError, json.JSONDecodeError) as exc:
                        raise SandboxFailed(f"SandboxFusion at {self.url}: {type(exc).__name__}: {exc}") from None
                yield fusion_result(reply, case["kind"], marker, self.limits)

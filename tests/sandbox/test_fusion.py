"""The SandboxFusion backend against a stand-in server that speaks its `/run_code` protocol (and runs the test's own
programs with a plain `python` subprocess): the requests it sends, the case kinds through its footers, and a server
that fails."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from prime_rl.envs.code_tests import CodeTests, CodeTestsOptions
from prime_rl.sandbox import Limits, SandboxFailed
from prime_rl.sandbox.fusion import FusionSandbox
from prime_rl.utils.errors import UserError


class RunCode:
    """POST /run_code as SandboxFusion answers it, running the code with this Python."""

    def __init__(self):
        self.bodies = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/run_code" and request.method == "POST"
        body = json.loads(request.content)
        self.bodies.append(body)
        try:
            done = subprocess.run([sys.executable, "-c", body["code"]], input=body["stdin"], text=True,
                                  capture_output=True, timeout=body["run_timeout"])
            run = {"status": "Finished", "execution_time": 0.01, "return_code": done.returncode,
                   "stdout": done.stdout, "stderr": done.stderr}
        except subprocess.TimeoutExpired:
            run = {"status": "TimeLimitExceeded", "execution_time": body["run_timeout"], "return_code": None,
                   "stdout": "", "stderr": ""}
        status = "Success" if run["return_code"] == 0 else "Failed"
        return httpx.Response(200, json={"status": status, "message": "", "compile_result": None,
                                         "run_result": run, "files": {}})


def collect(sandbox, code, cases):
    async def go():
        return [r async for r in sandbox.run(code, cases)]
    return asyncio.run(go())


def test_each_case_is_one_request_and_every_kind_comes_back():
    server = RunCode()
    sandbox = FusionSandbox("http://fusion.test:8080/", Limits(timeout_s=2.0, memory_mib=512),
                            transport=httpx.MockTransport(server))
    code = "def f(x):\n    print('noise')\n    return {x, 1}\nif __name__ == '__main__':\n    print(input()[::-1])"
    cases = [{"kind": "stdio", "stdin": "abc\n"}, {"kind": "call", "fn": "f", "args": "[3]"},
             {"kind": "assert", "code": "assert f(2) == {1, 2}"}, {"kind": "assert", "code": "assert f(2) == 0"}]
    results = collect(sandbox, code, cases)
    assert [r.status for r in results] == ["ok", "ok", "ok", "error"]
    assert results[0].stdout == "cba\n" and results[1].result == "[1, 3]" and results[2].result == "true"
    assert {k: server.bodies[0][k] for k in ("language", "stdin", "run_timeout", "memory_limit_MB")} == {
        "language": "python", "stdin": "abc\n", "run_timeout": 2.0, "memory_limit_MB": 512}


def test_code_tests_scores_through_the_server_and_an_early_exit_does_not_pass():
    reward = CodeTests(CodeTestsOptions.parse({"sandbox": "sandbox_fusion", "url": "http://fusion.test"}, "e"))
    reward.sandbox._transport = httpx.MockTransport(RunCode())
    row = {"test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]}
    assert asyncio.run(reward("```python\ndef add(a, b):\n    return a + b\n```", "", **row)).total == 0.5
    cheat = "```python\nimport os\ndef add(a, b):\n    return 0\nos._exit(0)\n```"
    assert asyncio.run(reward(cheat, "", **row)).total == 0.0


@pytest.mark.slow
def test_a_timeout_and_a_failing_server_are_told_apart():
    sandbox = FusionSandbox("http://fusion.test", Limits(timeout_s=0.5), transport=httpx.MockTransport(RunCode()))
    assert collect(sandbox, "while True: pass", [{"kind": "stdio", "stdin": ""}])[0].status == "timeout"
    broken = FusionSandbox("http://fusion.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={"status": "SandboxError", "message": "no worker"})))
    with pytest.raises(SandboxFailed, match="SandboxFusion: no worker"):
        collect(broken, "print(1)", [{"kind": "stdio", "stdin": ""}])
    down = FusionSandbox("http://fusion.test", transport=httpx.MockTransport(lambda request: httpx.Response(502)))
    with pytest.raises(SandboxFailed, match="HTTPStatusError"):
        collect(down, "print(1)", [{"kind": "stdio", "stdin": ""}])
    with pytest.raises(UserError, match="must start with http"):
        FusionSandbox("fusion.test:8080")

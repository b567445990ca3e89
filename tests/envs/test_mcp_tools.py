"""Tools from a real MCP server over stdio (`envs/mcp_tools.py`, the `mcp` SDK): listed once, called with the
model's arguments, errors counted like every tool error, and a server that dies or hangs fails the rollout (not
the run) and is started afresh."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from prime_rl.envs.mcp_tools import McpServer, McpServerFailed
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.env_calls import call_env
from prime_rl.utils.errors import UserError
from tests.support.mcp_envs import SERVER, McpCalculator

pytestmark = pytest.mark.slow  # each starts an MCP server process (~1.5 s)

ENV = "tests.support.mcp_envs:McpCalculator"


def turn(*calls: str) -> list[dict]:
    return [{"role": "assistant", "content": "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)}]


def test_a_servers_tools_are_listed_once_as_openai_schemas_and_called_with_the_models_arguments():
    env = McpCalculator()
    names = [t["function"]["name"] for t in env.tools]
    assert names == ["multiply", "divide", "pid", "hang"]
    multiply = env.tools[0]["function"]
    assert multiply["description"] == "Multiply two integers."
    assert multiply["parameters"]["properties"]["a"]["type"] == "integer" and multiply["parameters"]["required"]

    async def run():
        example = next(env.examples())
        try:
            return await env.respond(example, turn(
                '{"name": "multiply", "arguments": {"a": 6, "b": 7}}',
                '{"name": "divide", "arguments": {"a": 1, "b": 0}}',        # the tool raises: is_error
                '{"name": "multiply", "arguments": {"a": "six", "b": 7}}',  # the schema's type: not sent
                '{"name": "multiply", "arguments": {"a": 6}}',              # a required argument missing
                '{"name": "add", "arguments": {"a": 1, "b": 2}}',           # not a tool of the server
            ), env.initial_state(example))
        finally:
            await env.mcp["multiply"].close()

    reply = asyncio.run(run())
    contents = [m["content"] for m in reply.messages]
    assert contents[0] == "42" and contents[1].startswith("error:") and "division by zero" in contents[1]
    assert "'a' must be integer" in contents[2] and "missing argument(s) 'b'" in contents[3]
    assert "unknown tool 'add'" in contents[4]
    assert reply.tool_calls == 5 and reply.tool_errors == ("exception", "bad_arguments", "bad_arguments",
                                                           "unknown_tool")


def test_a_killed_server_fails_the_rollout_and_the_next_call_starts_it_again():
    env = McpCalculator()
    draw = Draw("mcp-calculator", env, next(env.examples()), EnvConfig(id=ENV))
    server = env.mcp["pid"]

    async def run():
        try:
            state = env.initial_state(draw.example)
            first = await env.respond(draw.example, turn('{"name": "pid", "arguments": {}}'), state)
            os.kill(int(first.messages[0]["content"]), signal.SIGKILL)
            await asyncio.sleep(0.2)
            _, why = await call_env(draw, "respond", env.respond(draw.example, turn(
                '{"name": "multiply", "arguments": {"a": 2, "b": 3}}'), state), "respond_timeout_s")
            again = await env.respond(draw.example, turn('{"name": "pid", "arguments": {}}'), state)
            return first.messages[0]["content"], why, again.messages[0]["content"]
        finally:
            await server.close()

    old, why, new = asyncio.run(run())
    assert "respond raised McpServerFailed" in why and "multiply" in why  # seen dead, or silent past the limit
    assert new.isdigit() and new != old


def test_a_hung_call_fails_within_the_tool_timeout_and_the_server_is_replaced():
    env = McpCalculator(tool_timeout_s=1.0)
    server = env.mcp["hang"]

    async def run():
        try:
            with pytest.raises(McpServerFailed, match="hang did not answer within 1s"):
                await server.call("hang", {"seconds": 30}, 1.0)
            return await server.call("multiply", {"a": 2, "b": 3}, 5.0)
        finally:
            await server.close()

    assert asyncio.run(run()) == ("6", False)


def test_a_server_that_cannot_start_is_one_line_at_config_time(tmp_path):
    with pytest.raises(ValueError, match="MCP server command 'no-such-mcp-server' not found"):
        EnvConfig(id=ENV, args={"mcp_servers": [["no-such-mcp-server"]]})
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(3)\n")
    with pytest.raises(UserError, match="did not list its tools"):
        McpServer([SERVER[0], str(broken)], list_timeout_s=20)
    with pytest.raises(ValueError, match="two tools named 'multiply'"):
        EnvConfig(id=ENV, args={"mcp_servers": [SERVER, SERVER]})

"""The calculator task as a plain `openai` loop whose tools come from an MCP server (examples/agent/mcp_calculator.py,
over stdio): started and listed once per orchestrator process, on the first rollout, and shared by every rollout.

    [[orchestrator.env]]
    id = "agent"
    args = { function = "examples/agent/mcp_loop.py:run", task = { id = "calculator" } }

A tool the server flags as an error comes back to the model as an "error: ..." tool message; a server that died
or hung fails the rollout (McpServerFailed) and is started again for the next call.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prime_rl.envs.mcp_tools import McpServer

MAX_TURNS = 3
SERVER_COMMAND = [sys.executable, str(Path(__file__).with_name("mcp_calculator.py"))]
_server: McpServer | None = None


def server() -> McpServer:
    global _server
    if _server is None:
        _server = McpServer(SERVER_COMMAND)  # its tools listed once (this blocks the first rollout ~1-2 s)
    return _server


async def run(client, example):
    tools = server()
    messages = [dict(m) for m in example.prompt]
    for _ in range(MAX_TURNS):
        answer = await client.chat.completions.create(model="policy", messages=messages, tools=tools.tools)
        reply = answer.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            text, is_error = await tools.call(call.function.name, _arguments(call.function.arguments), 5.0)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": f"error: {text}" if is_error else text})
    return None


def _arguments(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

"""The calculator task as a plain `openai` agent loop: the agent calls the model with its tools, runs the tool
calls it gets back, and calls again until the model answers without a tool call (at most MAX_TURNS calls).

    [[orchestrator.env]]
    id = "agent"
    args = { function = "examples/agent/openai_loop.py:run", task = { id = "calculator" } }

It returns no reward: the `calculator` task scores the conversation the session recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the example's own helper module beside it

from calculator_tools import SCHEMAS, run_tool  # noqa: E402

MAX_TURNS = 3


async def run(client, example):
    messages = [dict(m) for m in example.prompt]
    for _ in range(MAX_TURNS):
        answer = await client.chat.completions.create(model="policy", messages=messages, tools=SCHEMAS)
        reply = answer.choices[0].message
        messages.append(reply.model_dump(exclude_none=True))  # the assistant message exactly as returned
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    return None

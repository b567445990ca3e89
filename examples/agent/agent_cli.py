"""The calculator task as a command-line agent, the shape of any program configured by OPENAI_BASE_URL and
OPENAI_API_KEY: it reads the example as JSON on stdin and prints its reward as JSON (null: let the task score).

    [[orchestrator.env]]
    id = "agent"
    args = { command = ["python", "examples/agent/agent_cli.py"], task = { id = "calculator" } }
"""

from __future__ import annotations

import json
import sys

import openai
from calculator_tools import SCHEMAS, run_tool  # beside this file (a script's own folder is on sys.path)

MAX_TURNS = 3


def main() -> None:
    example = json.load(sys.stdin)
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: this rollout's session
    messages = list(example["prompt"])
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=SCHEMAS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": run_tool(call.function.name, call.function.arguments)})
    print(json.dumps(None))


if __name__ == "__main__":
    main()

"""The calculator task as an OpenAI Agents SDK (`openai-agents`) agent with two function tools.

    [[orchestrator.env]]
    id = "agent"
    args = { function = "examples/agent/agents_sdk.py:run", task = { id = "calculator" } }

The SDK runs the loop (model call, tool calls, model call, ...) against the session's client; tracing is off
(it would send traces to OpenAI). It returns no reward: the `calculator` task scores the recorded conversation.
"""

from __future__ import annotations

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

set_tracing_disabled(True)
MAX_TURNS = 3


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def run(client, example):
    agent = Agent(name="calculator", tools=[multiply, add],
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(parallel_tool_calls=True))
    try:
        await Runner.run(agent, [dict(m) for m in example.prompt], max_turns=MAX_TURNS)
    except (MaxTurnsExceeded, ModelBehaviorError):  # too many calls, or a call of a tool it does not have
        pass  # the task scores what the policy wrote (a conversation without a right answer scores 0)
    return None

"""The calculator task's two tools, as plain Python functions, for the example agents (the `calculator`
environment's own tools are the same; these belong to the agent, which runs them itself)."""

from __future__ import annotations

import json


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = {"multiply": multiply, "add": add}
SCHEMAS = [{"type": "function", "function": {
    "name": name, "description": fn.__doc__,
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}} for name, fn in TOOLS.items()]


def run_tool(name: str, arguments: str) -> str:
    """A tool call's result as the tool message's text ("error: ..." when it cannot run)."""
    try:
        return str(TOOLS[name](**json.loads(arguments)))
    except Exception as exc:  # an unknown tool, bad JSON, wrong arguments: the policy reads the error
        return f"error: {type(exc).__name__}: {exc}"

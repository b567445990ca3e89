"""An MCP server over stdio for the tests (`mcp` SDK 2.x): the calculator's tools, and tools that fail, hang, or
kill the server."""

from __future__ import annotations

import os
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("test-calculator")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
def hang(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


if __name__ == "__main__":
    server.run()

"""The calculator's two tools as an MCP server over stdio (the `mcp` SDK), for examples/agent/mcp_loop.py."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    server.run()

"""Tools served by MCP servers over stdio, through the `mcp` SDK (2.x).

    server = McpServer(["python", "tools/server.py"])   # its tools listed once, here (a one-line error if not)
    server.tools                                         # their OpenAI schemas, for `tools=`
    text, is_error = await server.call("multiply", {"a": 2, "b": 3})

A server is started and listed once per process when an `McpServer` of its command is first made (at config time for
an environment's servers: a command that is not found, a server that fails to start or to list its tools is a one-
line `UserError`), then connected on the first call in the caller's event loop and kept for the run: its session is
held open by a task of its own (the SDK's context must be entered and left in one task), and calls from any task
share it. A call answers the tool's text (its text parts joined, or its structured content as JSON) and whether the
server flagged it as an error (`is_error`: the tool raised, the arguments did not validate, an unknown tool). A
server that died, or a call that outlasts its timeout (a hung server), raises `McpServerFailed`: the rollout fails,
not the run, and the next call starts the server afresh. The child gets the SDK's allow-listed environment (`HOME`,
`PATH`, ...; `env` adds to it) and exits when its stdin closes, so it never outlives the orchestrator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import json
import shutil
from typing import Any

from prime_rl.utils.errors import UserError

LIST_TIMEOUT_S = 60.0  # starting a server and listing its tools, at construction
_LISTED: dict[tuple, list[dict[str, Any]]] = {}  # (command, env) -> its tools' schemas, listed once per process


class McpServerFailed(RuntimeError):
    """The MCP server died, hung past the call's timeout, or could not be (re)started."""


def why_failed(exc: BaseException, timeout_s: float) -> str:
    """A one-line reason: an exception group's first leaf (the SDK wraps its task group's errors), a timeout as
    such."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g}s"
    return f"{type(exc).__name__}: {str(exc)[:300] or '(no message)'}"


def openai_schema(tool: Any) -> dict[str, Any]:
    """An MCP `Tool` as an OpenAI function tool schema."""
    parameters = dict(tool.input_schema or {"type": "object", "properties": {}})
    parameters.pop("title", None)
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": parameters}}


def result_text(result: Any) -> str:
    """A `CallToolResult` as the tool message's text: its text parts, else its structured content as JSON."""
    texts = [part.text for part in result.content or () if getattr(part, "type", None) == "text"]
    if texts:
        return "\n".join(texts)
    return json.dumps(result.structured_content) if result.structured_content is not None else ""


class McpServer:
    """One MCP server over stdio (module docstring)."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None, list_timeout_s: float = LIST_TIMEOUT_S):
        if not (isinstance(command, list) and command and all(isinstance(part, str) for part in command)):
            raise UserError(f"an MCP server's command must be a non-empty list of strings, got {command!r}")
        if shutil.which(command[0]) is None:
            raise UserError(f"MCP server command {command[0]!r} not found (neither on PATH nor as a path to an "
                            "executable file)")
        self.command, self.env = list(command), dict(env or {})
        key = (tuple(self.command), tuple(sorted(self.env.items())))
        if key not in _LISTED:  # once per process: config checks, the run's environments and eval's share it
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, whoever calls
                try:
                    _LISTED[key] = pool.submit(asyncio.run, self._list(list_timeout_s)).result()
                except Exception as exc:
                    raise UserError(f"MCP server {' '.join(command)!r} did not list its tools: "
                                    f"{why_failed(exc, list_timeout_s)} (is it an MCP server over stdio?)") from None
        self.tools = copy.deepcopy(_LISTED[key])
        self._client: Any = None
        self._holder: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop its session lives in
        self._connecting = asyncio.Lock()

    def _connection(self) -> Any:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(command=self.command[0], args=self.command[1:], env=self.env or None)
        return Client(stdio_client(params), mode="legacy")

    async def _list(self, timeout_s: float) -> list[dict[str, Any]]:
        async with asyncio.timeout(timeout_s), self._connection() as client:
            return [openai_schema(tool) for tool in (await client.list_tools()).tools]

    async def _connect(self) -> Any:
        """The open session, started (in a task of its own) when there is none or the last one ended."""
        if self._loop is not asyncio.get_running_loop():  # first use, or a new loop (the old one's session ended)
            self._loop, self._holder, self._connecting = asyncio.get_running_loop(), None, asyncio.Lock()
        async with self._connecting:
            if self._holder is not None and not self._holder.done():
                return self._client
            ready: asyncio.Future = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()

            async def hold(stop: asyncio.Event) -> None:
                try:
                    async with self._connection() as client:
                        self._client = client
                        ready.set_result(client)
                        await stop.wait()
                except BaseException as exc:
                    if not ready.done():
                        ready.set_exception(exc)
                    raise
                finally:
                    self._client = None

            self._holder = asyncio.create_task(hold(self._stop))
            try:
                return await asyncio.wait_for(ready, LIST_TIMEOUT_S)
            except Exception as exc:
                raise McpServerFailed(f"MCP server {self.command[0]!r} did not start: "
                                      f"{why_failed(exc, LIST_TIMEOUT_S)}") from None

    async def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
        """(the tool's text, whether the server flagged an error); `McpServerFailed` when the server died or the
        call outlasted `timeout_s` (then the server is restarted on the next call)."""
        client = await self._connect()
        try:
            result = await asyncio.wait_for(client.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            await self.close()  # a hung server: the next call starts a fresh one
            raise McpServerFailed(f"MCP server {self.command[0]!r}: {name} did not answer within {timeout_s:g}s"
                                  ) from None
        except Exception as exc:  # the connection broke: the server died
            await self.close()
            raise McpServerFailed(f"MCP server {self.command[0]!r} failed during {name}: "
                                  f"{why_failed(exc, timeout_s)}") from None
        return result_text(result), bool(result.is_error)

    async def close(self) -> None:
        """End the session and stop the server (a later call starts it again)."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(holder, 10)

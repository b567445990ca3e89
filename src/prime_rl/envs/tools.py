"""Tool environments: the policy calls plain Python functions, the environment answers with their results.

A subclass lists its tools in `tool_functions()` (plain functions or bound methods, sync or
async, called with keyword arguments); `tools` are their OpenAI schemas, built from each
signature and docstring (`chat/tool_calls.function_schema`). After each policy turn,
`respond` reads the turn's `<tool_call>` blocks (Hermes / Qwen format) and answers each
with one `tool` message, in the order written; a turn without a block ends the rollout.

Nothing a tool or the model does raises out of `respond`: a malformed block, an unknown
tool, arguments that do not fit the signature or the schema's types, an exception, a call
running past `tool_timeout_s` each become a tool message starting with `error:` that names
the problem, and an entry in `EnvReply.tool_errors` (`bad_json`, `unknown_tool`,
`bad_arguments`, `exception`, `timeout`). A tool's output (`str(result)`, JSON for a dict or
list) is cut to `max_tool_output_chars`, with a marker saying how many characters were cut.

Tools may also come from MCP servers (`mcp_servers`: each a command, e.g. ["python", "tools/server.py"];
`envs/mcp_tools.py`): listed once when the environment is made, offered beside the functions, checked against
their JSON schemas (required and unknown arguments, the declared types: `bad_arguments`), and called on the server
within `tool_timeout_s`; an answer the server flags `is_error` is an `exception`. A server that dies or hangs
fails the rollout (under the environment's `on_error`), not the run, and is started afresh for the next call.

A sync tool runs in a daemon thread of its own (one per call). Python cannot kill a
thread: a call that times out is abandoned and its thread runs on in the background
until the function returns, but it never blocks the event loop or the process's exit
(the default executor's threads would be joined at exit). An async tool is awaited on the
event loop with the same timeout (cancelled when it runs past it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

from prime_rl.chat.tool_calls import MalformedCall, ToolCall, format_tool_call, function_schema, parse_tool_calls
from prime_rl.envs.environment import EnvReply, Example, MultiTurnEnvironment, require
from prime_rl.envs.mcp_tools import McpServer

ERROR = "error:"
"""How every failed call's tool message starts."""

JSON_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


async def run_in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a new daemon thread, awaited; cancelling the await abandons the thread (it runs on, unjoined)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(result)

    def run() -> None:
        try:
            outcome = (fn(*args), None)
        except BaseException as exc:  # handed to the awaiting side, whatever it is
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the call ran: nobody waits for it any more
            pass

    threading.Thread(target=run, name=f"tool-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return await future


class ToolEnvironment(MultiTurnEnvironment):
    """A multi-turn environment whose replies are the results of the policy's tool calls.

    Implement `tool_functions()`, `examples(seed)` and `score_rollout`; the constructor arguments below are
    TOML `args` (a subclass passes its own on to `super().__init__`). `state["tool_calls"]` and
    `state["tool_errors"]` count the rollout's calls and failed calls so far.
    """

    def __init__(self, max_turns: int = 4, tool_timeout_s: float = 5.0, max_tool_output_chars: int = 2000,
                 mcp_servers: list | None = None):
        require(max_turns >= 1, self.id, f"max_turns must be >= 1, got {max_turns}")
        require(tool_timeout_s > 0, self.id, f"tool_timeout_s must be > 0, got {tool_timeout_s}")
        require(max_tool_output_chars >= 1, self.id, f"max_tool_output_chars must be >= 1, got {max_tool_output_chars}")
        self.max_turns, self.tool_timeout_s, self.max_tool_output_chars = (
            max_turns, tool_timeout_s, max_tool_output_chars)
        functions = self.tool_functions()
        self.tools = [function_schema(fn) for fn in functions]
        self.functions: dict[str, Callable[..., Any]] = {}
        for fn, schema in zip(functions, self.tools, strict=True):
            name = schema["function"]["name"]
            if name in self.functions:
                raise ValueError(f"{type(self).__name__} has two tools named {name!r}")
            self.functions[name] = fn
        self.mcp: dict[str, McpServer] = {}  # tool name -> the MCP server that serves it
        for command in mcp_servers or []:
            server = McpServer(command)
            for schema in server.tools:
                name = schema["function"]["name"]
                require(name not in self.functions and name not in self.mcp, self.id,
                        f"two tools named {name!r} (MCP server {' '.join(command)!r})")
                self.mcp[name] = server
                self.tools.append(schema)
        self._schemas = {schema["function"]["name"]: schema["function"]["parameters"] for schema in self.tools}

    @abstractmethod
    def tool_functions(self) -> list[Callable[..., Any]]:
        """The tools: plain functions or bound methods (sync or async) with typed parameters and a docstring;
        each is offered to the model under its `__name__`."""

    def initial_state(self, example: Example) -> dict[str, Any]:
        return {"tool_calls": 0, "tool_errors": 0}

    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        """One tool message per `<tool_call>` block of the last assistant message (in order), or done when it has
        none."""
        last = messages[-1] if messages else {}
        blocks = parse_tool_calls(str(last.get("content") or "")).blocks if last.get("role") == "assistant" else []
        if not blocks:
            return EnvReply(done=True)
        replies, errors = [], []
        for block in blocks:
            reply, error = await self.run_call(block)
            replies.append(reply)
            errors += [error] if error else []
        state["tool_calls"] = state.get("tool_calls", 0) + len(blocks)
        state["tool_errors"] = state.get("tool_errors", 0) + len(errors)
        return EnvReply(messages=replies, tool_calls=len(blocks), tool_errors=tuple(errors))

    async def run_call(self, block: ToolCall | MalformedCall) -> tuple[dict[str, Any], str | None]:
        """The tool message answering one block, and the kind of its failure (None when the tool ran)."""
        name = block.name if isinstance(block, ToolCall) else ""
        content, error = self._refusal(block) or await self._call(block)
        return {"role": "tool", "tool_call_id": block.id, "name": name, "content": self.cut(content)}, error

    def tool_call_turn(self, name: str, arguments: dict[str, Any]) -> list[dict[str, Any]]:
        """The assistant message calling tool `name` with `arguments`, and the tool message `respond` answers it
        with (the call runs here, through the same path; not from inside a running event loop). For
        `demonstration`s: replayed through `respond`, the turn gets the identical tool message."""
        text = format_tool_call(name, arguments)
        (block,) = parse_tool_calls(text).blocks
        reply, _ = asyncio.run(self.run_call(block))
        return [{"role": "assistant", "content": text}, reply]

    def cut(self, text: str) -> str:
        """`text` cut to `max_tool_output_chars`, with a marker saying how many characters were cut; characters
        that are no valid Unicode (lone surrogates, e.g. from an undecodable file name) are escaped."""
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        if len(text) <= self.max_tool_output_chars:
            return text
        return f"{text[:self.max_tool_output_chars]}...[{len(text) - self.max_tool_output_chars} chars cut]"

    def _refusal(self, block: ToolCall | MalformedCall) -> tuple[str, str] | None:
        """(error message, kind) for a block that cannot run, else None."""
        if isinstance(block, MalformedCall):
            return f"{ERROR} {block.reason}", block.kind
        if block.name not in self.functions and block.name not in self.mcp:
            names = ", ".join([*self.functions, *self.mcp])
            return f"{ERROR} unknown tool {block.name!r} (tools: {names})", "unknown_tool"
        problem = self._argument_problem(block)
        return (f"{ERROR} bad arguments for {block.name}: {problem}", "bad_arguments") if problem else None

    def _argument_problem(self, call: ToolCall) -> str | None:
        """Why `call.arguments` do not fit its function's signature or the schema's types, else None."""
        if call.name in self.mcp:
            return self._schema_problem(call)
        signature = inspect.signature(self.functions[call.name])
        try:
            signature.bind(**call.arguments)
        except TypeError as exc:
            return str(exc)
        properties = self._schemas[call.name]["properties"]
        for key, value in call.arguments.items():
            if value is None and signature.parameters[key].default is None:
                continue
            expected = properties[key]["type"]
            if not JSON_TYPE_CHECKS[expected](value):
                return f"{key!r} must be {expected}, got {json.dumps(value)[:40]}"
        return None

    def _schema_problem(self, call: ToolCall) -> str | None:
        """Why `call.arguments` do not fit an MCP tool's JSON schema (required, unknown, declared types), else
        None; the server validates the rest."""
        schema = self._schemas[call.name]
        properties = schema.get("properties") or {}
        missing = [key for key in schema.get("required") or () if key not in call.arguments]
        if missing:
            return f"missing argument(s) {', '.join(map(repr, missing))}"
        if schema.get("additionalProperties") is not True and (unknown := set(call.arguments) - set(properties)):
            return f"unknown argument(s) {', '.join(map(repr, sorted(unknown)))}"
        for key, value in call.arguments.items():
            expected = properties.get(key, {}).get("type")
            if isinstance(expected, str) and expected in JSON_TYPE_CHECKS and not JSON_TYPE_CHECKS[expected](value):
                return f"{key!r} must be {expected}, got {json.dumps(value)[:40]}"
        return None

    async def _call(self, call: ToolCall) -> tuple[str, str | None]:
        if call.name in self.mcp:  # a dead or hung server raises McpServerFailed: the rollout fails
            text, is_error = await self.mcp[call.name].call(call.name, call.arguments, self.tool_timeout_s)
            return (f"{ERROR} {text}", "exception") if is_error else (text, None)
        fn = self.functions[call.name]
        try:
            if inspect.iscoroutinefunction(fn):
                return await asyncio.wait_for(self._outcome_async(fn, call.arguments), self.tool_timeout_s)
            return await asyncio.wait_for(run_in_daemon_thread(self._outcome, fn, call.arguments), self.tool_timeout_s)
        except TimeoutError:
            return f"{ERROR} {call.name} timed out after {self.tool_timeout_s:g}s", "timeout"

    def _outcome(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> tuple[str, str | None]:
        """Run a sync tool (in its worker thread): (its output, None) or (the exception as an error, "exception")."""
        try:
            return self._output(fn(**arguments)), None
        except (Exception, SystemExit) as exc:  # SystemExit: a tool built on argparse or sys.exit must not end the run
            return self._exception(exc), "exception"

    async def _outcome_async(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> tuple[str, str | None]:
        try:
            return self._output(await fn(**arguments)), None
        except (Exception, SystemExit) as exc:
            return self._exception(exc), "exception"

    @staticmethod
    def _output(result: Any) -> str:
        return json.dumps(result, default=str) if isinstance(result, dict | list) else str(result)

    @staticmethod
    def _exception(exc: BaseException) -> str:
        try:
            message = str(exc)
        except Exception:  # an exception whose __str__ raises is still a tool error
            message = "(its message cannot be printed)"
        return f"{ERROR} {type(exc).__name__}: {message}"

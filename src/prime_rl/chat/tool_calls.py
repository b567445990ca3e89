"""Tool calls in the Hermes / Qwen text format, and OpenAI tool schemas from Python functions.

A model calls a tool by writing a block into its turn:

    <tool_call>
    {"name": "multiply", "arguments": {"a": 12, "b": 34}}
    </tool_call>

`parse_tool_calls(text)` splits a turn into its text and its calls (any number of blocks,
each numbered `call_<index>` in the order written); `format_tool_call` writes one block.
`function_schema(fn)` describes a plain Python function as an OpenAI tool schema (the
`tools=` a chat template renders). Pure Python: the inference server and the environments
both use it.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prime_rl.utils.strict_json import finite_float, refuse_constant

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ARG_ENTRY = re.compile(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")  # an `Args:` entry: `name (type): description`

JSON_TYPES: dict[type, str] = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
                               dict: "object"}
"""The Python annotations `function_schema` understands, and their JSON schema types."""


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: the `index`-th block of its turn (0-based), the tool's name and its arguments."""

    index: int
    name: str
    arguments: dict[str, Any]

    @property
    def id(self) -> str:
        """`call_<index>`: unique within a turn, the `tool_call_id` of the tool message that answers it."""
        return f"call_{self.index}"

    def openai(self) -> dict[str, Any]:
        """The call in OpenAI's response format (`arguments` a JSON string)."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments)}}


@dataclass(frozen=True)
class MalformedCall:
    """A block that is no call: the `index`-th of its turn, its `kind` (always `bad_json`) and a one-line `reason`."""

    index: int
    kind: str
    reason: str

    @property
    def id(self) -> str:
        return f"call_{self.index}"


@dataclass(frozen=True)
class ParsedTurn:
    """A model turn split into its text (`content`: every block removed, stripped) and its blocks."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    malformed: tuple[MalformedCall, ...] = ()

    @property
    def blocks(self) -> list[ToolCall | MalformedCall]:
        """Calls and malformed blocks together, in the order the model wrote them."""
        return sorted([*self.calls, *self.malformed], key=lambda block: block.index)


def _loads(text: str) -> Any:
    """Strict JSON (no NaN/Infinity): ValueError with a one-line reason."""
    try:
        return json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    except ValueError as exc:  # NaN/Infinity, or a number that overflows to infinity
        raise ValueError(f"not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """A call's arguments as a dict: an object, or (as OpenAI sends them) a JSON string holding one.
    ValueError otherwise."""
    if isinstance(arguments, str):
        try:
            arguments = _loads(arguments)
        except ValueError as exc:
            raise ValueError(f"arguments string is {exc}") from None
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    return arguments


def _parse_block(index: int, body: str) -> ToolCall | MalformedCall:
    try:
        call = _loads(body.strip())
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ValueError('a tool call must be a JSON object with a string "name" and an object "arguments"')
        if "arguments" not in call:
            raise ValueError(f'the call of {call["name"]!r} has no "arguments"')
        return ToolCall(index, call["name"], parse_arguments(call["arguments"]))
    except ValueError as exc:
        return MalformedCall(index, "bad_json", str(exc))


def parse_tool_calls(text: str) -> ParsedTurn:
    """Split a model turn into its text and its `<tool_call>` blocks (whitespace around each block's JSON allowed).

    A block is well-formed when it holds a JSON object with a string `name` and an object `arguments` (or a JSON
    string holding an object); any other block, and an unclosed `<tool_call>` at the end, is `bad_json`.
    A stray `</tool_call>` is text.
    """
    pieces: list[str] = []
    calls: list[ToolCall] = []
    malformed: list[MalformedCall] = []
    pos = 0
    while (start := text.find(OPEN, pos)) != -1:
        pieces.append(text[pos:start])
        end = text.find(CLOSE, start + len(OPEN))
        index = len(calls) + len(malformed)
        if end == -1:
            malformed.append(MalformedCall(index, "bad_json", f"unclosed {OPEN} (no {CLOSE})"))
            pos = len(text)
            break
        block = _parse_block(index, text[start + len(OPEN):end])
        (calls if isinstance(block, ToolCall) else malformed).append(block)
        pos = end + len(CLOSE)
    pieces.append(text[pos:])
    return ParsedTurn("".join(pieces).strip(), tuple(calls), tuple(malformed))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """One call as the model writes it (the layout of Qwen's chat template), which `parse_tool_calls` reads back."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _json_schema(annotation: Any) -> dict[str, Any] | None:
    """The JSON schema of a supported annotation (`X | None` as X), else None."""
    if annotation in JSON_TYPES:
        return {"type": JSON_TYPES[annotation]}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _json_schema(rest[0]) if len(rest) == 1 else None
    if origin is list:
        if not args:
            return {"type": "array"}
        items = _json_schema(args[0])
        return {"type": "array", "items": items} if items is not None else None
    if origin is dict:
        return {"type": "object"} if not args or args[0] is str else None
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph joined into one line, {parameter: description} from a Google-style `Args:` section)."""
    lines = doc.splitlines()
    paragraph = []
    for line in lines:
        if not line.strip() or line.strip() in ("Args:", "Arguments:"):
            break
        paragraph.append(line.strip())
    described: dict[str, str] = {}
    header = next((i for i, line in enumerate(lines) if line.strip() in ("Args:", "Arguments:")), None)
    if header is None:
        return " ".join(paragraph), described
    indent = _indent(lines[header])
    current, entry_indent = None, None
    for line in lines[header + 1:]:
        if not line.strip():
            continue
        if _indent(line) <= indent:
            break  # the next section (Returns:, Raises:, ...)
        entry = ARG_ENTRY.match(line.strip())
        if entry and entry_indent in (None, _indent(line)):  # `name (type): text`, as deep as the first entry
            current, entry_indent = entry.group(1), _indent(line)
            described[current] = entry.group(2).strip()
        elif current is not None:  # a continuation line
            described[current] = f"{described[current]} {line.strip()}".strip()
    return " ".join(paragraph), described


def function_schema(fn: Callable) -> dict[str, Any]:
    """The OpenAI tool schema of a plain function: its name, its docstring's first paragraph as the description,
    one property per parameter (typed from its annotation: int, float, str, bool, list[...], dict, or `X | None`;
    described by the docstring's Google-style `Args:` section when present); parameters without a default are
    required. ValueError naming the function and the parameter for *args/**kwargs, positional-only parameters,
    and missing or unsupported annotations."""
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # an annotation naming something that does not exist
        raise ValueError(f"tool {name}: cannot read its type hints ({exc})") from None
    description, described = _docstring_parts(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ValueError(f"tool {name}: parameter {param.name!r} must be a named parameter (no *args, **kwargs "
                             "or positional-only parameters: a tool is called with keyword arguments)")
        if param.name not in hints:
            raise ValueError(f"tool {name}: parameter {param.name!r} has no type annotation")
        schema = _json_schema(hints[param.name])
        if schema is None:
            raise ValueError(f"tool {name}: parameter {param.name!r} has the unsupported annotation "
                             f"{hints[param.name]!r} (supported: int, float, str, bool, list[...], dict, X | None)")
        if param.name in described:
            schema["description"] = described[param.name]
        properties[param.name] = schema
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}

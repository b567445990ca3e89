"""Hermes / Qwen tool-call text: parsing (well-formed, malformed, unclosed, several) and writing; OpenAI tool schemas
from Python functions."""

from __future__ import annotations

import json

import pytest

from prime_rl.chat.tool_calls import MalformedCall, ToolCall, format_tool_call, function_schema, parse_tool_calls


def test_several_calls_with_whitespace_and_text_around_them():
    text = ('Let me compute.\n<tool_call>\n  {"name": "multiply", "arguments": {"a": 12, "b": 34}}  \n</tool_call>\n'
            'and<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>  ')
    turn = parse_tool_calls(text)
    assert turn.content == "Let me compute.\n\nand"
    assert turn.calls == (ToolCall(0, "multiply", {"a": 12, "b": 34}), ToolCall(1, "add", {"a": 1, "b": 2}))
    assert [c.id for c in turn.calls] == ["call_0", "call_1"] and turn.malformed == ()
    assert turn.calls[0].openai() == {"id": "call_0", "type": "function",
                                      "function": {"name": "multiply", "arguments": '{"a": 12, "b": 34}'}}


def test_text_without_calls_is_all_content():
    turn = parse_tool_calls("  42 </tool_call> \n")
    assert turn.content == "42 </tool_call>" and turn.calls == () and turn.malformed == () and turn.blocks == []


def test_arguments_as_a_json_string_holding_an_object_are_accepted():
    turn = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": [1, 2]}"}</tool_call>')
    assert turn.calls == (ToolCall(0, "f", {"x": [1, 2]}),)


@pytest.mark.parametrize(("body", "reason"), [
    ('{"name": "f", "arguments": {"a": 1}', "not valid JSON"),
    ('["f", {}]', 'a JSON object with a string "name"'),
    ('{"name": 3, "arguments": {}}', 'a JSON object with a string "name"'),
    ('{"name": "", "arguments": {}}', 'a JSON object with a string "name"'),
    ('{"name": "f"}', "has no \"arguments\""),
    ('{"name": "f", "arguments": [1]}', "arguments must be a JSON object"),
    ('{"name": "f", "arguments": "[1]"}', "arguments must be a JSON object"),
    ('{"name": "f", "arguments": "{oops"}', "arguments string is not valid JSON"),
    ('{"name": "f", "arguments": {"a": NaN}}', "NaN is not valid JSON"),
    ('{"name": "f", "arguments": {"a": 1e400}}', "the number 1e400 is out of range"),
    ("", "not valid JSON"),
])
def test_malformed_blocks_are_bad_json_with_a_reason(body, reason):
    turn = parse_tool_calls(f"ok <tool_call>{body}</tool_call>")
    assert turn.content == "ok" and turn.calls == ()
    (bad,) = turn.malformed
    assert bad.kind == "bad_json" and bad.id == "call_0" and reason in bad.reason and "\n" not in bad.reason


def test_unclosed_block_at_the_end_is_bad_json_after_the_good_ones():
    good = format_tool_call("f", {"a": 1})
    turn = parse_tool_calls(f'{good} then <tool_call>{{"name": "g", "arguments": {{}}}}')
    assert turn.content == "then" and turn.calls == (ToolCall(0, "f", {"a": 1}),)
    assert turn.malformed == (MalformedCall(1, "bad_json", "unclosed <tool_call> (no </tool_call>)"),)
    assert [b.id for b in turn.blocks] == ["call_0", "call_1"]


def test_malformed_and_good_blocks_keep_their_order():
    turn = parse_tool_calls(f"<tool_call>nope</tool_call>{format_tool_call('f', {})}")
    assert [type(b).__name__ for b in turn.blocks] == ["MalformedCall", "ToolCall"]
    assert turn.calls[0].id == "call_1"


def test_format_tool_call_round_trips_in_the_qwen_layout():
    text = format_tool_call("multiply", {"a": 12, "b": 34})
    assert text == '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call>'
    assert parse_tool_calls(text).calls == (ToolCall(0, "multiply", {"a": 12, "b": 34}),)


def search(query: str, limit: int, exact: bool = False, tags: list[str] | None = None, weights: dict[str, float] = None,
           scale: float = 1.0) -> list[str]:
    """Search the index for documents.

    Finds what matches best,
    best first.

    Args:
        query (str): The words to look for.
        limit: How many results
            to return at most.
        exact: Match whole words only.

    Returns:
        The matching documents.
    """
    return []


def test_schema_from_signature_and_google_docstring():
    schema = function_schema(search)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "search"
    assert function["description"] == "Search the index for documents."
    parameters = function["parameters"]
    assert parameters["type"] == "object" and parameters["required"] == ["query", "limit"]
    assert parameters["properties"] == {
        "query": {"type": "string", "description": "The words to look for."},
        "limit": {"type": "integer", "description": "How many results to return at most."},
        "exact": {"type": "boolean", "description": "Match whole words only."},
        "tags": {"type": "array", "items": {"type": "string"}},
        "weights": {"type": "object"},
        "scale": {"type": "number"},
    }
    json.dumps(schema)  # plain JSON


def test_schema_without_docstring_and_of_a_bound_method():
    class Tools:
        def lookup(self, key: str) -> str:
            return key

    assert function_schema(Tools().lookup)["function"] == {
        "name": "lookup", "description": "",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    }


def star_args(a: int, *rest: int) -> int:
    return a


def star_kwargs(a: int, **options: str) -> int:
    return a


def positional_only(a: int, /) -> int:
    return a


def unannotated(a, b: int) -> int:
    return b


def unsupported(a: int, when: complex) -> int:
    return a


def mixed_union(a: int | str) -> int:
    return 0


@pytest.mark.parametrize(("fn", "message"), [
    (star_args, "tool star_args: parameter 'rest' must be a named parameter"),
    (star_kwargs, "tool star_kwargs: parameter 'options' must be a named parameter"),
    (positional_only, "tool positional_only: parameter 'a' must be a named parameter"),
    (unannotated, "tool unannotated: parameter 'a' has no type annotation"),
    (unsupported, "tool unsupported: parameter 'when' has the unsupported annotation"),
    (mixed_union, "tool mixed_union: parameter 'a' has the unsupported annotation"),
])
def test_schema_errors_name_the_function_and_the_parameter(fn, message):
    with pytest.raises(ValueError, match=message):
        function_schema(fn)

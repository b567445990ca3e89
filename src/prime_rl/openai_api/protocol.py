"""OpenAI-style request bodies the builtin server accepts (a subset of vLLM's, same names), the limits every
backend applies to them (`context_overflow`, `budget_overflow`), and `Completion`, one sampled choice as an engine
hands it to the answer builders (`api.py`).

Fields a client may send that do not change the result (`stream: false`, `user`,
`logprobs`, `return_token_ids`: token ids and logprobs are always returned) are accepted
and ignored; fields the builtin backend cannot honour are rejected with a 400.

Bodies are parsed strictly (`parse_json`) and numeric fields are typed strictly (no
booleans or strings for numbers, every float finite), so a malformed request is a 400 at
the boundary and never reaches the engine, where it could fail other requests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from prime_rl.chat.template_tokens import RESERVED_TEMPLATE_KWARGS, check_template_kwargs
from prime_rl.chat.tool_calls import parse_arguments
from prime_rl.utils.strict_json import finite_float, refuse_constant

MAX_JSON_DEPTH = 32  # the deepest request the API defines is 4 levels; deeper nesting is refused
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # the seed range, as vLLM's
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs, so what is left here is alone

Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def integral(value: Any) -> Any:
    """A float with an integral value as that int (JSON Schema counts 2.0 as an integer); anything else as is, for
    StrictInt to judge (it refuses booleans, strings and fractions)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def Int(**bounds: Any) -> Any:  # noqa: N802 (a type)
    """An integer field: a JSON integer (2.0 too), never a boolean or a string, within `bounds` (ge, le, ...). The
    bounds sit inside the float-to-int step, so the JSON schema states them (`minimum`, `maximum`)."""
    return Annotated[StrictInt, Field(**bounds), BeforeValidator(integral)]
TOKEN_ID_MARK = "x-token-id"  # `openapi.document` bounds these by the served vocabulary
COMPLETION_MARK = "x-completion-length"  # and these by the served context


def documented(**schema: Any) -> Any:
    """A field whose JSON schema (`/openapi.json`) also says `schema`: what a validator below refuses with its own
    one-line message, said in the schema so that clients and fuzzers see what is accepted."""
    return Field(json_schema_extra=schema)


TokenId = Int(ge=0, json_schema_extra={TOKEN_ID_MARK: True})


def _check_tree(value: Any) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and strings (values or keys) with a lone surrogate.

    A lone surrogate ("\\ud800") is valid JSON but no valid text: it cannot be encoded, so
    a tokenizer fails on it. Iterative, so no depth makes it recurse.
    """
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if LONE_SURROGATE.search(node):
                raise ValueError("a string holds a lone UTF-16 surrogate (not valid Unicode text)")
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else ((None, v) for v in node)
        for key, child in items:
            if key is not None:
                stack.append((key, depth))
            stack.append((child, depth + 1))


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, strictly; anything else raises ValueError with a one-line reason.

    Strict means: UTF-8; no `NaN`/`Infinity` constants or numbers that overflow to
    infinity; no lone surrogates; at most MAX_JSON_DEPTH levels of nesting.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("malformed JSON body: not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"malformed JSON body ({exc.msg} at position {exc.pos})") from None
    except ValueError as exc:  # our constant/float refusals, or an integer with too many digits
        raise ValueError(f"malformed JSON body: {exc}") from None
    _check_tree(value)
    return value


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    arguments: Annotated[dict[str, Any], WithJsonSchema({"anyOf": [{"type": "object"}, {"type": "string"}]})]
    """An object, or (as OpenAI sends it) a JSON string holding one: parsed, as chat templates expect a dict."""

    @field_validator("arguments", mode="before")
    @classmethod
    def _parse_arguments(cls, value: Any) -> dict[str, Any]:
        return parse_arguments(value)


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


CONTENT_RULE = {"anyOf": [  # `_content_or_calls` in JSON schema
    {"required": ["content"], "properties": {"content": {"type": "string"}}},
    {"required": ["role", "tool_calls"],
     "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}},
]}


class ChatMessage(BaseModel):
    """A message: `content` is text, or null in an assistant message with `tool_calls`; a `tool` message answers
    a call (`tool_call_id`, `name`). Other keys pass through to the chat template."""

    model_config = ConfigDict(extra="allow", json_schema_extra=CONTENT_RULE)

    role: str
    content: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_or_calls(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only in an assistant message with tool_calls)")
        return self

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template gets it: the keys the client sent (`content` always: null becomes ""
        when rendered, `chat.template_tokens.render_chat`), arguments as dicts."""
        return {"content": self.content, **self.model_dump(exclude_unset=True)}


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)


class Tool(BaseModel):
    """An OpenAI tool schema, checked loosely: a function with a name (the rest goes to the chat template as sent)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: ToolFunction


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    n: Int(ge=1, le=1024) = 1
    temperature: Annotated[Float, Field(ge=0)] = 1.0
    top_p: Annotated[Float, Field(gt=0, le=1)] = 1.0
    top_k: Int(ge=-1) = -1
    min_p: Annotated[Float, Field(ge=0, le=1)] = 0.0
    max_tokens: Int(ge=1, json_schema_extra={COMPLETION_MARK: True}) | None = None
    stop: Annotated[str, documented(minLength=1)] | list[Annotated[str, documented(minLength=1)]] | None = None
    seed: Int(ge=INT64_MIN, le=INT64_MAX) | None = None
    logprobs: StrictBool | Int(ge=0, json_schema_extra={"maximum": 1}) | None = None
    """Chat: a boolean; completions: 0 or 1 (the sampled token's logprob is always returned)."""
    stream: Annotated[StrictBool, documented(const=False)] = False
    top_logprobs: Int(json_schema_extra={"minimum": 0, "maximum": 0}) | None = None
    prompt_logprobs: Int(ge=0, json_schema_extra={"maximum": 0}) | None = None
    """vLLM's scoring option: the logprob of every prompt token given the tokens before it, at `temperature`
    (0: untempered) and without truncation; only 0 (the prompt token itself, no alternatives), on /v1/completions."""

    @model_validator(mode="after")
    def _supported(self):
        if self.stream:
            raise ValueError("stream=true is not supported by the builtin backend")
        if self.prompt_logprobs:
            raise ValueError("prompt_logprobs > 0 (top alternatives) is not supported by the builtin backend")
        if self.top_logprobs:
            raise ValueError("top_logprobs is not supported by the builtin backend (the sampled token's logprob is)")
        if isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool) and self.logprobs > 1:
            raise ValueError("logprobs > 1 (top alternatives) is not supported by the builtin backend")
        return self

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops


class ChatRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int(ge=1, json_schema_extra={COMPLETION_MARK: True}) | None = None
    tools: list[Tool] | None = None
    tool_choice: Annotated[Any, documented(enum=["auto", "none", None])] = None
    chat_template_kwargs: Annotated[dict[str, Any], documented(
        propertyNames={"not": {"enum": sorted(RESERVED_TEMPLATE_KWARGS)}})] | None = None
    """Variables for the chat template (vLLM's field), e.g. {"enable_thinking": false}; never a renderer argument
    such as `chat_template` (a request cannot bring its own template)."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_template_kwargs(value)

    prompt_logprobs: Annotated[Int(ge=0) | None, documented(type="null")] = None  # refused here (validator below)

    @field_validator("prompt_logprobs")
    @classmethod
    def _completions_only(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("prompt_logprobs is served on /v1/completions (with token ids), not on chat")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _auto_or_none(cls, value: Any) -> Any:
        if value not in (None, "auto", "none"):
            raise ValueError('tool_choice must be "auto" or "none" (the builtin backend cannot force a tool call)')
        return value

    @property
    def parses_tool_calls(self) -> bool:
        """Whether the answer's tool-call text becomes `tool_calls`: tools were given and tool_choice is not none."""
        return bool(self.tools) and self.tool_choice != "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The `tools=` of the chat template: the schemas as sent, or None."""
        return [tool.model_dump(exclude_unset=True) for tool in self.tools] if self.tools else None

    @model_validator(mode="before")
    @classmethod
    def _one_limit(cls, data: Any) -> Any:
        """`max_completion_tokens` (the newer name) is `max_tokens` when that is not given."""
        if isinstance(data, dict) and data.get("max_tokens") is None and "max_completion_tokens" in data:
            return {**data, "max_tokens": data["max_completion_tokens"]}
        return data


MAX_PROMPTS = 1024  # prompts of one completions request (a batch of token-id prompts)


class CompletionRequest(SamplingFields):
    prompt: str | list[TokenId] | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                                            documented(maxItems=MAX_PROMPTS)] = Field(
        min_length=1, json_schema_extra={"minLength": 1, "minItems": 1})
    """A text, token ids, or a batch of token-id prompts (as vLLM: choice p * n + j is prompt p's choice j)."""
    echo: Annotated[StrictBool, documented(const=False)] = False

    @model_validator(mode="after")
    def _no_echo(self):
        if self.echo:
            raise ValueError("echo is not supported by the builtin backend")
        if self.batched and len(self.prompt) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request")
        return self

    @property
    def batched(self) -> bool:
        """The prompt is a list of token-id prompts."""
        return isinstance(self.prompt, list) and isinstance(self.prompt[0], list)


def context_filled(prompt_tokens: int, context_len: int, what: str = "prompt") -> str:
    """The one line of a prompt (`what`) that leaves no room for a completion."""
    return f"the {what} ({prompt_tokens} tokens) fills the context length {context_len}"


def context_overflow(prompt_tokens: int, max_tokens: int, context_len: int) -> str | None:
    """Why a request cannot be served when prompt + max_tokens exceeds the context, else None.

    Both backends answer such a request with a 400 rather than shortening the completion
    (vLLM on its own would clamp max_tokens to the room left).
    """
    if prompt_tokens + max_tokens <= context_len:
        return None
    return f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the context length {context_len}"


def budget_overflow(prompts: int, n: int, max_tokens: int, budget: int) -> str | None:
    """Why a request is refused for asking too much, else None: its completion tokens at most, prompts x n x
    max_tokens (`max_tokens` the largest any prompt gets), past `budget` (`max_request_tokens`). One request
    may not hold the server for minutes: 64 prompts x n = 1024 x 2,000 tokens is 131 M tokens."""
    asked = prompts * n * max_tokens
    if asked <= budget:
        return None
    return (f"the request asks for up to {asked:,} completion tokens (prompts x n x max_tokens = {prompts} x {n} x "
            f"{max_tokens}), past this server's budget of {budget:,} per request (max_request_tokens)")


class ResetRequest(BaseModel):
    """`POST /reset`'s body: an empty JSON object (an admin request is JSON, `guard.py`)."""

    model_config = ConfigDict(extra="forbid")


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    step: Int(ge=0, le=INT64_MAX) | None = None
    in_flight: StrictBool = False  # apply between decode iterations without draining (builtin backend only)


@dataclass
class Completion:
    """One finished choice as an engine hands it over: completion token ids, their logprobs, the text, why it
    stopped, and the weight step each token was sampled under (the answer's `token_weight_steps`); with prompt
    logprobs asked for (the builtin engine's `SamplingParams.prompt_logprobs`), (logprob, rank) of every prompt
    token after the first."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    weight_steps: list[int]  # one per token, never decreasing
    prompt_logprobs: list[tuple[float, int]] | None = None

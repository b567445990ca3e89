"""An agent's calls within one rollout session, stitched into training segments, token-exact.

An agent that owns its loop sends the whole conversation with every chat call. The session renders nothing it
already holds: for each call (`begin_call`) it decides whether the call extends the session's current segment, and
hands back the token ids to generate from; the reply the policy sampled is then recorded (`end_call`) with the
assistant message the session returned for it.

Extending. Call k + 1 extends the segment of call k when it has the same tools and its messages are call k's
messages, then call k's assistant message exactly as the session returned it, then only messages that are not the
assistant's (tool results, a user turn; possibly none). Its prompt is then

    prompt ids of the segment + every id after them so far + the template tail of the new messages

(`ChatTokens.reply_ids`: the end of the sampled turn, the new messages, the next generation prompt), so every id
before the tail is exactly what the server sampled (mask 1, its logprobs and weight steps) or a tail rendered
once (mask 0, logprob 0), as multi-turn environments do (`orchestrator/rollouts/multi_turn.py`).

Forking. Anything else starts a new segment from a fresh rendering of the call's messages, and the segment before
it stays a training sample of its own: the trainer never sees ids the policy did not sample under the prompt it
sampled them from. The reasons, counted in `forks`:

    retry          the same messages as an earlier call of the segment (the agent or its SDK asked again)
    history_edit   a message before the last reply changed or went away (a summary, a rewritten tool result)
    reply_edit     the last reply is replayed differently (its reasoning dropped, as Qwen3's template does; its
                   text or tool calls changed); an assistant message the policy did not sample is one too
    tools          another tool list

Messages are compared as the chat template sees them (`canonical`): role, text (a null content or a list of text
parts is text), reasoning (`reasoning_content` or `reasoning`), tool calls (id, name, arguments as JSON values, so
`{"a": 1}` and `'{"a":1}'` are one call), `tool_call_id`, `name`; what an SDK adds besides (`refusal: null`,
`annotations`) does not count.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.orchestrator.client import RolloutCompletion

FORK_REASONS = ("retry", "history_edit", "reply_edit", "tools")


def _text(content: Any) -> str:
    """A message's content as text: None is "", a list of parts is its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _arguments(arguments: Any) -> Any:
    """A tool call's arguments as JSON values (a JSON string is parsed; other text stays as it is)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def canonical(message: dict[str, Any]) -> tuple:
    """What of `message` the chat template renders, comparable (module docstring)."""
    calls = tuple((call.get("id"), call.get("function", {}).get("name"),
                   json.dumps(_arguments(call.get("function", {}).get("arguments")), sort_keys=True))
                  for call in message.get("tool_calls") or ())
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    return (message.get("role"), _text(message.get("content")), reasoning, calls, message.get("tool_call_id"),
            message.get("name"))


@dataclass
class Segment:
    """One training sample of a rollout: the prompt of its first call and its record of every id after it
    (environment ids: mask false)."""

    prompt_ids: list[int]
    tools: list[dict[str, Any]] | None
    record: RolloutCompletion = field(default_factory=RolloutCompletion.empty)
    history: list[tuple] = field(default_factory=list)  # canonical messages up to and including the last reply
    messages: list[dict[str, Any]] = field(default_factory=list)  # the same, as sent and returned
    requests: list[list[tuple]] = field(default_factory=list)  # each call's canonical messages
    calls: int = 0


@dataclass
class _Call:
    """A call between `begin_call` and `end_call`: what `end_call` applies to the session (nothing before it, so a
    call whose generation fails leaves no trace)."""

    segment: Segment  # the segment it extends, or a new one
    fork: str | None  # why it opens a new segment (None: it extends, or it is the first)
    tail: list[int]  # the template tail it appends to an extended segment
    wanted: list[tuple]  # its canonical messages
    messages: list[dict[str, Any]]


class SessionStitcher:
    """The segments of one rollout session (module docstring). Calls run one at a time: `begin_call`, generate,
    then `end_call` (or `abandon_call` when the generation failed)."""

    def __init__(self, chat_tokens: ChatTokens):
        self.chat_tokens = chat_tokens
        self.segments: list[Segment] = []
        self.forks: Counter[str] = Counter()
        self._call: _Call | None = None

    def begin_call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The token ids to generate this call's reply from: the current segment extended, or a new one."""
        if self._call is not None:
            raise RuntimeError("begin_call before the previous call's end_call")
        wanted = [canonical(m) for m in messages]
        current = self.segments[-1] if self.segments else None
        fork = None if current is None else self._fork_reason(current, wanted, tools)
        if current is None or fork is not None:
            call = _Call(Segment(self.chat_tokens.prompt_ids(messages, tools or []), tools), fork, [], wanted,
                         list(messages))
        else:
            new = messages[len(current.history):]
            record = current.record
            last = next((i for i, keep in zip(reversed(record.token_ids), reversed(record.mask), strict=True) if keep),
                        None)
            tail = self.chat_tokens.reply_ids(current.messages, new, tools or [], last)
            call = _Call(current, None, tail, wanted, list(messages))
        self._call = call
        return call.segment.prompt_ids + call.segment.record.token_ids + call.tail

    def abandon_call(self) -> None:
        """Drop the call `begin_call` opened (its generation failed): the session is as before it, and the agent may
        retry."""
        if self._call is None:
            raise RuntimeError("abandon_call without begin_call")
        self._call = None

    def end_call(self, sampled: RolloutCompletion, reply: dict[str, Any]) -> None:
        """Record the call: its template tail, its sampled ids (their logprobs and weight steps) and the assistant
        message the session returned for them (`reply`, which the next call must replay to extend the segment)."""
        call = self._call
        if call is None:
            raise RuntimeError("end_call without begin_call")
        segment = call.segment
        if not self.segments or segment is not self.segments[-1]:
            self.segments.append(segment)
        if call.fork is not None:
            self.forks[call.fork] += 1
        segment.record.add_context(call.tail)
        segment.record.add_sampled(sampled)
        segment.requests.append(call.wanted)
        segment.history = [*call.wanted, canonical(reply)]
        segment.messages = [*call.messages, reply]
        segment.calls += 1
        self._call = None

    @staticmethod
    def _fork_reason(segment: Segment, wanted: list[tuple], tools: list[dict[str, Any]] | None) -> str | None:
        """Why this call cannot extend `segment` (module docstring), or None."""
        if (tools or None) != (segment.tools or None):
            return "tools"
        if wanted in segment.requests:
            return "retry"
        known = len(segment.history) - 1  # the messages before the last reply
        if wanted[:known] != segment.history[:known]:
            return "history_edit"
        if len(wanted) <= known or wanted[known] != segment.history[known]:
            return "reply_edit"
        if any(message[0] == "assistant" for message in wanted[known + 1:]):
            return "reply_edit"  # an assistant turn the policy did not sample
        return None

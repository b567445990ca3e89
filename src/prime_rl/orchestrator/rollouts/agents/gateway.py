"""Rollout sessions on an OpenAI-compatible API: the gateway an agent that owns its loop talks to.

Each rollout opens a session (`open_session`) and hands the agent its base URL, `<gateway>/sessions/<id>/v1`, and
a key valid for that session only (`Authorization: Bearer <key>`; another session's key, an ended session's, or
none: 401). The agent calls `chat/completions` as it would any OpenAI-compatible server, with `tools`,
`tool_choice` ("auto" or "none") and `stream`; per call the gateway

1. stitches the call into the session's segments (`agent_stitching.SessionStitcher`): the token ids to generate
   from are the session's own ids plus a template tail, or a fresh rendering when the agent edited its history;
2. generates one reply from those ids on the run's inference servers (token in, token out), under the session's
   sampling rule and `max_tokens` (the run's; a request's sampling fields do not change them: the trainer scores
   the reply under the rule the batch records; a request's `max_tokens` may only lower the limit);
3. answers with the reply split as the template writes it: reasoning first (`reasoning_content`, also as
   `reasoning`; `chat/reasoning.py`), then tool calls in the rest (`chat.tool_calls`; each with an id of
   its own, `call_<hex>`: SDKs refuse an id a session already used); `stream = true` gets
   the same answer as server-sent events (role, reasoning, content, tool calls with their `index`, the finish, then
   `[DONE]`), generated whole first;
4. records the reply with the assistant message it returned, which the agent's next call must replay to extend
   the segment.

Calls of one session run one at a time, in arrival order (a session is one conversation; an agent that
fans out opens a session per branch). `close_session` ends the session (its key is refused from then on, and a
call still generating when it ends is dropped) and returns its stitcher: the segments the trainer will see. `n`
must be 1: a rollout's group is made of sessions. `AgentRunner` (`rollouts/agents/runner.py`) serves the app
on 127.0.0.1 and runs the agents.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import model_validator

from prime_rl.chat.reasoning import split_reasoning
from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.openai_api.http_api import HTTPError, answer, chat_message, context_room, json_app, model_card, parse
from prime_rl.openai_api.protocol import ChatRequest, Completion
from prime_rl.orchestrator.client import InferenceClient, RolloutCompletion, call_seed
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.rollouts.agents.stitching import SessionStitcher


def text_parts_joined(message: Any) -> Any:
    """A message whose content is a list of text parts (`{"type": "text" | "input_text" | "output_text", "text"}`,
    as SDKs send them) with its content as their text joined; another part (an image, audio) is a ValueError."""
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return message
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"only text content is supported in a rollout session, got a {kind!r} part")
        texts.append(part["text"])
    return {**message, "content": "".join(texts)}


TEXT_PARTS = ("text", "input_text", "output_text")


class AgentChatRequest(ChatRequest):
    """A chat request as an agent sends it: the inference server's shape, with `stream` allowed, `n` = 1, and a
    content given as text parts read as its text."""

    @model_validator(mode="before")
    @classmethod
    def _text_parts(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("messages"), list):
            return {**data, "messages": [text_parts_joined(m) for m in data["messages"]]}
        return data

    @model_validator(mode="after")
    def _supported(self):  # replaces the server's rule, which refuses `stream`
        if self.n != 1:
            raise ValueError("n must be 1 in a rollout session (a group's rollouts are separate sessions)")
        if self.top_logprobs:
            raise ValueError("top_logprobs is not supported in a rollout session")
        return self


@dataclass
class Session:
    """One rollout's session: where the agent sends its calls and the key that opens it."""

    id: str
    key: str
    base_url: str
    rule: SamplingRule
    max_tokens: int
    seed: int | None
    stitcher: SessionStitcher
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    calls: int = 0
    replies: list[dict[str, Any]] = field(default_factory=list)  # every assistant message returned, in order
    closed: bool = False


def assistant_message(completion: RolloutCompletion, with_tools: bool, reasoning: ReasoningConfig | None
                      ) -> tuple[dict[str, Any], str]:
    """The assistant message of a sampled reply and its finish reason: reasoning split off first (with `reasoning`
    configured), then the tool calls of the rest (with `with_tools`; a text whose calls do not all parse stays
    text). The message is what the session records and the agent replays."""
    text, thought = completion.text, None
    if reasoning is not None and reasoning.parser == "think":
        split = split_reasoning(text, reasoning.start_tag, reasoning.end_tag, reasoning.opened_by_prompt)
        text, thought = split.answer, split.reasoning
    answer = chat_message(Completion(completion.token_ids, completion.logprobs, text, completion.finish_reason,
                                     completion.weight_steps), with_tools)  # the server's tool-call rule
    message = answer["message"]
    if thought is not None:
        message["reasoning_content"] = thought
    return message, answer["finish_reason"]


def _events(answer: dict[str, Any]) -> AsyncIterator[bytes]:
    """`answer` as the chunks of a streamed chat completion (module docstring)."""
    choice = answer["choices"][0]
    message = choice["message"]
    base = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("reasoning_content") is not None:
        deltas.append({"reasoning_content": message["reasoning_content"], "reasoning": message["reasoning_content"]})
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or ()):
        deltas.append({"tool_calls": [{"index": index, **call}]})

    async def chunks() -> AsyncIterator[bytes]:
        for delta in deltas:
            yield b"data: " + json.dumps(base | {"choices": [{"index": 0, "delta": delta,
                                                              "finish_reason": None}]}).encode() + b"\n\n"
        last = base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
                       "usage": answer["usage"]}
        yield b"data: " + json.dumps(last).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    return chunks()


SESSION_REFUSED = "invalid API key for this session (or the session has ended)"
"""The one 401 of a session's routes: a wrong key, an unknown session and an ended one answer alike."""


class AgentGateway:
    """The sessions of a run's agent rollouts and the HTTP app that serves them (module docstring)."""

    def __init__(self, client: InferenceClient, chat_tokens: ChatTokens, seq_len: int, served_model: str,
                 reasoning: ReasoningConfig | None = None, root_url: str = "http://127.0.0.1"):
        self.client = client
        self.chat_tokens = chat_tokens
        self.seq_len = seq_len
        self.served_model = served_model
        self.reasoning = reasoning
        self.root_url = root_url.rstrip("/")
        self.sessions: dict[str, Session] = {}
        self.app = self._build_app()

    def open_session(self, rule: SamplingRule, max_tokens: int, seed: int | None = None) -> Session:
        """A new session: its own id, key and base URL; its calls sample under `rule`, at most `max_tokens` each
        (`seed`: the first call's sampling seed; call k uses `client.call_seed(seed, k)`, as a multi-turn
        rollout's turns do, so no two rollouts of a group share a call's seed)."""
        session_id = uuid.uuid4().hex
        session = Session(session_id, f"sk-session-{secrets.token_urlsafe(24)}",
                          f"{self.root_url}/sessions/{session_id}/v1", rule, max_tokens, seed,
                          SessionStitcher(self.chat_tokens))
        self.sessions[session_id] = session
        return session

    def close_session(self, session_id: str) -> Session:
        """End the session (its key is refused from now on; a call still generating is dropped) and return it."""
        session = self.sessions.pop(session_id)
        session.closed = True
        return session

    def _session(self, request: Request, session_id: str) -> Session:
        """The session a call may use: its key, and only its key (401 otherwise, the same answer for an unknown or
        ended session as for a wrong key, so a key reveals nothing about other sessions)."""
        session = self.sessions.get(session_id)
        sent = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if session is None or not secrets.compare_digest(sent.encode(), session.key.encode()):
            raise HTTPError(401, SESSION_REFUSED)
        return session

    async def chat(self, session: Session, body: AgentChatRequest) -> dict[str, Any]:
        """One call of `session` (module docstring, steps 1-4): the chat.completion answer."""
        async with session.lock:
            if session.closed:  # a call that waited for the lock while its rollout ended
                raise HTTPError(401, SESSION_REFUSED)
            tools = body.template_tools()
            messages = [m.template_dict() for m in body.messages]
            try:
                prompt_ids = await asyncio.to_thread(session.stitcher.begin_call, messages, tools)
            except Exception as exc:  # a template that cannot render these messages
                raise HTTPError(400, f"the chat template cannot render this conversation: {exc}") from None
            try:
                room = context_room(len(prompt_ids), self.seq_len, "conversation")
            except HTTPError:
                session.stitcher.abandon_call()
                raise
            limit = min(session.max_tokens, room, body.max_tokens or session.max_tokens)
            try:
                result = await self.client.complete(prompt_ids, 1, session.rule, limit,
                                                    call_seed(session.seed, session.calls))
            except BaseException:
                session.stitcher.abandon_call()
                raise
            if session.closed:  # the rollout ended while this call generated: nothing of it trains
                session.stitcher.abandon_call()
                raise HTTPError(401, SESSION_REFUSED)
            (completion,) = result.completions
            message, finish = assistant_message(completion, body.parses_tool_calls, self.reasoning)
            for call in message.get("tool_calls") or ():  # ids unique in the session (SDKs refuse a reused one)
                call["id"] = f"call_{uuid.uuid4().hex[:24]}"
            session.stitcher.end_call(completion, message)
            session.calls += 1
            session.replies.append(message)
        answer_message = dict(message)
        if "reasoning_content" in message:
            answer_message["reasoning"] = message["reasoning_content"]
        choice = {"index": 0, "message": answer_message, "finish_reason": finish, "logprobs": None,
                  "token_ids": completion.token_ids, "token_weight_steps": completion.weight_steps}
        return answer("chat.completion", body.model or self.served_model, prompt_ids, result.weight_step, [choice])

    def _build_app(self) -> FastAPI:
        app = json_app("prime-rl agent gateway", AccessPolicy())

        @app.post("/sessions/{session_id}/v1/chat/completions")
        async def chat_completions(session_id: str, request: Request):
            session = self._session(request, session_id)
            body = await parse(request, AgentChatRequest)
            answer = await self.chat(session, body)
            if body.stream:
                return StreamingResponse(_events(answer), media_type="text/event-stream")
            return answer

        @app.get("/sessions/{session_id}/v1/models")
        async def models(session_id: str, request: Request):
            self._session(request, session_id)
            return model_card(self.served_model, self.seq_len)

        return app

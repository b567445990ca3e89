"""Agent-session test parts: a scripted stand-in for the inference servers on the real Qwen3 tokenizer, a tool
schema, and what a test reads of a session's segments (`orchestrator/agent_stitching.Segment`)."""

from __future__ import annotations

import asyncio
import functools

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from tests.support.real_tokenizers import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]


@functools.cache
def qwen3() -> ChatTokens:
    return ChatTokens(load_tokenizer("qwen3"))


@functools.cache
def llama3() -> ChatTokens:
    return ChatTokens(load_tokenizer("llama3"))


END_OF_TURN = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}


class ScriptedServer:
    """Stands in for the inference servers: each call's reply is `reply(prompt_text)`, its ids the text's encoding
    and the tokenizer's end of turn (`tokenizer`: "qwen3" or "llama3"); every sampled token is recorded with its
    call's number as logprob and weight step; `delay_s` per call."""

    def __init__(self, reply, tokenizer: str = "qwen3", delay_s: float = 0.0):
        self.reply, self.calls, self.sampled, self.fail = reply, 0, [], False
        self.chat = {"qwen3": qwen3, "llama3": llama3}[tokenizer]()
        self.end_of_turn = self.chat.tokenizer.convert_tokens_to_ids(END_OF_TURN[tokenizer])
        self.delay_s = delay_s

    async def complete(self, prompt_ids, n, rule, max_tokens, seed=None) -> ChatResult:
        assert n == 1
        if self.fail:
            raise RuntimeError("the server went away")
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        chat = self.chat
        text = self.reply(chat.tokenizer.decode(prompt_ids))
        ids = [*chat.encode(text), self.end_of_turn][:max_tokens]
        self.sampled.append(ids)
        await asyncio.sleep(0)  # let other sessions' calls interleave
        return ChatResult(prompt_ids, self.calls, [RolloutCompletion(ids, [-self.calls / 100] * len(ids), text,
                                                                     "stop", [self.calls] * len(ids))])


def sampled_runs(record: RolloutCompletion) -> list[list[int]]:
    """A rollout record's runs of sampled (mask 1) ids, in order: one per call."""
    runs, current = [], []
    for token, keep in zip(record.token_ids, record.mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    return runs + ([current] if current else [])

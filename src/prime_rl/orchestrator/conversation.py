"""Multi-turn rollouts, token in, token out.

For one draw and `n` rollouts:

1. the prompt's ids are rendered once (`ChatTokens.prompt_ids`, with the environment's
   `tools`) and sent to the server's completions endpoint as token ids, `n` choices (one
   prefill);
2. each rollout goes on alone: the policy's turn is its sampled ids as the server returned
   them (loss mask 1, the server's logprobs, the weight step of every token); the
   environment answers (`respond`, within `respond_timeout_s`); the ids of its reply as the
   template renders it (`ChatTokens.reply_ids`; loss mask 0, logprob 0) are appended, and
   the whole id list so far is the next turn's prompt (seed: the rollout's seed + turn);
3. a rollout ends when the environment is done, after `max_turns` policy turns, when a
   turn is cut by `sampling.max_tokens` (truncated), or when the next turn would not fit
   `seq_len` (truncated by context: the reply is dropped, `rollout/context_truncated_frac`);
   an environment failure also ends it (failed by the caller, under `on_error`): `respond` raising or timing out,
   or answering something other than an `EnvReply` of messages with a string role and
   content, or a reply the chat template cannot render.

Every turn's `max_tokens` is the smaller of `sampling.max_tokens` and the room left in
`seq_len`, so no sample outgrows the trainer's rows. The rollout's ids after the prompt,
its mask and logprobs are one `RolloutCompletion`; what the trainer gets is exactly what the
server sampled, turn after turn. How each conversation went (turns, tokens, tool calls, the environment's
time) is its `TurnStats`, which a single-turn rollout has too (one turn).
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

from prime_rl.chat.reasoning import split_reasoning
from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.envs.environment import EnvReply, Rollout
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.client import ChatResult, InferenceClient, RolloutCompletion, call_seed
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.draws import Draw
from prime_rl.orchestrator.env_calls import call_env, report_failure
from prime_rl.utils.errors import UserError


@dataclass
class TurnStats:
    """How one rollout's conversation went (all 1/0 for a single-turn rollout, which is a one-turn conversation)."""

    turns: int = 1  # policy turns
    sampled_tokens: int = 0  # tokens the policy sampled (after the prompt)
    env_tokens: int = 0  # template and environment tokens between its turns
    tool_calls: int = 0
    tool_errors: collections.Counter[str] = field(default_factory=collections.Counter)  # by kind
    env_calls: int = 0  # `respond` calls
    env_s: float = 0.0  # seconds spent in them
    context_truncated: bool = False  # ended because the next turn would not fit seq_len
    reasoning_chars: int = 0  # characters of reasoning (`chat/reasoning.py`) over its turns
    unfinished_reasoning: bool = False  # its last turn opened a reasoning block and never closed it
    segments: int = 1  # training samples (an agent session that forked has several: `agent_stitching.py`)
    forks: collections.Counter[str] = field(default_factory=collections.Counter)  # an agent session's, by reason

    def add_split(self, text: str, reasoning: ReasoningConfig | None) -> str:
        """Count `text`'s reasoning (under `reasoning`, None: no parser) and return what the environment sees:
        the answer, or all of `text` without a parser."""
        if reasoning is None or reasoning.parser == "none":
            return text
        split = split_reasoning(text, reasoning.start_tag, reasoning.end_tag, reasoning.opened_by_prompt)
        self.reasoning_chars += len(split.reasoning or "")
        self.unfinished_reasoning = split.unfinished
        return split.answer


def malformed_reply(reply: object) -> str | None:
    """What is wrong with `respond`'s answer (an `EnvReply` of message dicts with a string role and string
    content, an int tool-call count and a tuple or list of error kinds), or None."""
    if not isinstance(reply, EnvReply):
        return f"a {type(reply).__name__}, not an EnvReply"
    for message in reply.messages if isinstance(reply.messages, list | tuple) else [reply.messages]:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            return f"a message that is not a dict with a string role and string content: {str(message)[:100]}"
    if not isinstance(reply.tool_calls, int) or not isinstance(reply.tool_errors, tuple | list):
        return "tool_calls that is not an int or tool_errors that is not a tuple of kinds"
    return None


@dataclass
class _Conversation:
    """One rollout under construction: the ids after the prompt and what describes them."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[bool] = field(default_factory=list)
    weight_steps: list[int] = field(default_factory=list)  # one per sampled token
    messages: list[dict] = field(default_factory=list)
    stats: TurnStats = field(default_factory=lambda: TurnStats(turns=0))
    finish_reason: str = "stop"
    error: str | None = None

    def add_turn(self, completion: RolloutCompletion, reasoning: ReasoningConfig | None = None) -> None:
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.mask += [True] * len(completion.token_ids)
        self.weight_steps += completion.weight_steps
        # The environment sees the turn's answer; its tokens stay as sampled, reasoning included.
        self.messages.append({"role": "assistant", "content": self.stats.add_split(completion.text, reasoning)})
        self.finish_reason = completion.finish_reason
        self.stats.turns += 1
        self.stats.sampled_tokens += len(completion.token_ids)

    def add_reply(self, ids: list[int], messages: list[dict]) -> None:
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [False] * len(ids)
        self.messages += messages
        self.stats.env_tokens += len(ids)

    def completion(self) -> RolloutCompletion:
        text = self.messages[-1]["content"] if self.messages else ""
        return RolloutCompletion(self.token_ids, self.logprobs, text, self.finish_reason, self.weight_steps, self.mask)


class ConversationRunner:
    """Runs the rollouts of multi-turn environments against the server (see the module docstring)."""

    def __init__(self, chat_tokens: ChatTokens, seq_len: int, reasoning: ReasoningConfig | None = None):
        self.chat_tokens = chat_tokens
        self.seq_len = seq_len
        self.reasoning = reasoning  # the environment sees each turn's answer (`chat/reasoning.py`)

    async def run_group(self, client: InferenceClient, draw: Draw, n: int, rule: SamplingRule,
                        max_tokens: int, seed: int | None
                        ) -> tuple[ChatResult, list[Rollout], list[TurnStats], list[str | None]]:
        """`n` conversations of `draw`: (their tokens as a ChatResult, the conversations to score, their stats, why
        each failed or None)."""
        env = draw.environment
        prompt_ids = await asyncio.to_thread(self.chat_tokens.prompt_ids, draw.example.prompt, env.tools)
        room = self.seq_len - len(prompt_ids)
        if room < 1:
            raise UserError(f"environment '{draw.env}': a prompt of {len(prompt_ids)} tokens leaves no room for an "
                            f"answer in seq_len {self.seq_len}")
        first = await client.complete(prompt_ids, n, rule, min(max_tokens, room), seed)

        async def rollout(index: int, completion: RolloutCompletion) -> tuple[_Conversation, Rollout]:
            turn_seed = None if seed is None else seed + index
            return await self._continue(client, draw, prompt_ids, completion, rule, max_tokens, turn_seed)

        done = await asyncio.gather(*(rollout(i, c) for i, c in enumerate(first.completions)))
        result = ChatResult(prompt_ids, first.weight_step, [conv.completion() for conv, _ in done])
        return result, [r for _, r in done], [conv.stats for conv, _ in done], [conv.error for conv, _ in done]

    async def _continue(self, client: InferenceClient, draw: Draw, prompt_ids: list[int], completion: RolloutCompletion,
                        rule: SamplingRule, max_tokens: int, seed: int | None
                        ) -> tuple[_Conversation, Rollout]:
        env, example = draw.environment, draw.example
        max_turns = draw.config.max_turns or env.max_turns
        state = env.initial_state(example)
        conv = _Conversation()
        while True:
            conv.add_turn(completion, self.reasoning)
            if completion.finish_reason == "length" or conv.stats.turns >= max_turns:
                break
            start = time.monotonic()
            reply, why = await call_env(draw, "respond", env.respond(example, list(conv.messages), state),
                                        "respond_timeout_s")
            conv.stats.env_calls += 1
            conv.stats.env_s += time.monotonic() - start
            if why is None and (problem := malformed_reply(reply)):
                why = report_failure(draw, f"respond returned {problem}")
            if why is None and not reply.done:
                history = [*example.prompt, *conv.messages]
                last = completion.token_ids[-1] if completion.token_ids else None
                try:
                    ids = await asyncio.to_thread(self.chat_tokens.reply_ids, history, reply.messages, env.tools, last)
                except (UserError, TypeError, ValueError) as exc:  # e.g. text that is no valid Unicode
                    why = report_failure(draw, f"respond's reply cannot be rendered: {type(exc).__name__}: {exc}")
            if why is not None:
                conv.error = why
                break
            conv.stats.tool_calls += reply.tool_calls
            conv.stats.tool_errors.update(reply.tool_errors)
            if reply.done:
                break
            room = self.seq_len - len(prompt_ids) - len(conv.token_ids) - len(ids)
            if room < 1:
                conv.stats.context_truncated = True
                conv.finish_reason = "length"
                break
            conv.add_reply(ids, reply.messages)
            (completion,) = (await client.complete(prompt_ids + conv.token_ids, 1, rule, min(max_tokens, room),
                                                   call_seed(seed, conv.stats.turns))).completions
        return conv, Rollout(conv.messages, conv.finish_reason == "length", state)

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
import time
from dataclasses import dataclass, field

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.envs.environment import EnvReply, Rollout
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.client import ChatResult, InferenceClient, RolloutCompletion, call_seed
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.env_calls import call_env, report_failure
from prime_rl.orchestrator.rollouts.scored_group import Group, TurnStats
from prime_rl.orchestrator.rollouts.scoring import cut_unsampleable, score_group
from prime_rl.orchestrator.rollouts.seam import RolloutSettings, RunnerContext
from prime_rl.orchestrator.servers import ServerPool
from prime_rl.utils.errors import UserError


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
    """One rollout under construction: its record of ids after the prompt, its messages, how it goes."""

    record: RolloutCompletion = field(default_factory=RolloutCompletion.empty)
    messages: list[dict] = field(default_factory=list)
    stats: TurnStats = field(default_factory=lambda: TurnStats(turns=0))
    error: str | None = None

    def add_turn(self, completion: RolloutCompletion, reasoning: ReasoningConfig | None = None) -> None:
        # The environment sees the turn's answer; its tokens stay as sampled, reasoning included.
        answer = self.stats.add_split(completion.text, reasoning)
        self.record.add_sampled(completion, text=answer)
        self.messages.append({"role": "assistant", "content": answer})
        self.stats.turns += 1
        self.stats.sampled_tokens += len(completion.token_ids)

    def add_reply(self, ids: list[int], messages: list[dict]) -> None:
        self.record.add_context(ids)
        self.messages += messages
        self.stats.env_tokens += len(ids)


class ConversationRunner:
    """The runner of kind "multi_turn": runs the rollouts of multi-turn environments against the server (see the
    module docstring)."""

    def __init__(self, client: InferenceClient | ServerPool, chat_tokens: ChatTokens, seq_len: int,
                 reasoning: ReasoningConfig | None = None):
        self.client = client
        self.chat_tokens = chat_tokens
        self.seq_len = seq_len
        self.reasoning = reasoning  # the environment sees each turn's answer (`chat/reasoning.py`)

    @classmethod
    def build(cls, context: RunnerContext) -> ConversationRunner:
        config = context.config
        return cls(context.client, context.chat_tokens, config.seq_len, config.reasoning)

    async def run_group(self, draw: Draw, n: int, rule: SamplingRule, settings: RolloutSettings,
                        seed: int | None) -> Group:
        """`n` conversations of `draw`, scored (an id past the tokenizer's cuts its rollout: `cut_unsampleable`)."""
        result, rollouts, stats, failed = await self._conversations(draw, n, rule, settings.max_tokens, seed)
        failed = cut_unsampleable(draw, [[c] for c in result.completions], settings.vocab, failed)
        return await score_group(draw, result, settings.truncated_reward, rollouts, stats, failed)

    async def stop(self) -> None:
        pass

    async def _conversations(self, draw: Draw, n: int, rule: SamplingRule, max_tokens: int, seed: int | None
                             ) -> tuple[ChatResult, list[Rollout], list[TurnStats], list[str | None]]:
        """`n` conversations of `draw`: (their tokens as a ChatResult, the conversations to score, their stats, why
        each failed or None)."""
        client = self.client
        env = draw.environment
        prompt_ids = await asyncio.to_thread(self.chat_tokens.prompt_ids, draw.example.prompt, env.tools)
        room = self.seq_len - len(prompt_ids)
        if room < 1:
            raise UserError(f"environment '{draw.env}': a prompt of {len(prompt_ids)} tokens leaves no room for an "
                            f"answer in seq_len {self.seq_len}")
        first = await client.complete(prompt_ids, n, rule, min(max_tokens, room), seed)

        async def rollout(index: int, completion: RolloutCompletion) -> tuple[_Conversation, Rollout]:
            turn_seed = None if seed is None else seed + index
            return await self._continue(draw, prompt_ids, completion, rule, max_tokens, turn_seed)

        done = await asyncio.gather(*(rollout(i, c) for i, c in enumerate(first.completions)))
        result = ChatResult(prompt_ids, first.weight_step, [conv.record for conv, _ in done])
        return result, [r for _, r in done], [conv.stats for conv, _ in done], [conv.error for conv, _ in done]

    async def _continue(self, draw: Draw, prompt_ids: list[int], completion: RolloutCompletion, rule: SamplingRule,
                        max_tokens: int, seed: int | None) -> tuple[_Conversation, Rollout]:
        client, env, example = self.client, draw.environment, draw.example
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
            room = self.seq_len - len(prompt_ids) - len(conv.record.token_ids) - len(ids)
            if room < 1:
                conv.stats.context_truncated = True
                conv.record.finish_reason = "length"
                break
            conv.add_reply(ids, reply.messages)
            (completion,) = (await client.complete(prompt_ids + conv.record.token_ids, 1, rule, min(max_tokens, room),
                                                   call_seed(seed, conv.stats.turns))).completions
        return conv, Rollout(conv.messages, conv.record.truncated, state)

"""Multi-turn environments for the end-to-end tests, imported by path (`tests.support.multi_turn_envs:ToolChat`)
by the `rl` processes, which get the repository root on PYTHONPATH."""

from __future__ import annotations

import random
import string

from prime_rl.envs.environment import EnvReply, Example, MultiTurnEnvironment, Reward, SyntheticEnvironment


class ToolChat(MultiTurnEnvironment, SyntheticEnvironment):
    """Three policy turns whatever the policy says: after each of the first two, a tool message (a call counted)
    with a few random letters. Reward: the share of distinct letters in the policy's turns (so groups differ)."""

    id = "tool-chat"
    max_turns = 3

    def make_example(self, rng: random.Random) -> Example:
        text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 6)))
        return Example([{"role": "user", "content": text}], text[::-1])

    async def respond(self, example, messages, state):
        state["calls"] = state.get("calls", 0) + 1
        return EnvReply([{"role": "tool", "content": example.answer[: state["calls"] + 1]}], tool_calls=1)

    async def score_rollout(self, example, rollout):
        text = "".join(m["content"] for m in rollout.messages if m["role"] == "assistant")
        return Reward(len(set(text)) / 26)

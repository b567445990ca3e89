"""`HeavyTailReverse`: reverse-text as a multi-turn episode whose length is heavy-tailed (`continuous_heavy_tail.py`).

An episode reverses K strings, one per policy turn: the user sends 5-12 random lowercase letters (as in
`reverse-text`), the policy answers, and while strings are left the environment answers with the next one after
`reply_latency_s` seconds (an `asyncio.sleep`: the latency of a tool or a simulated user, during which the server
has nothing to do for this rollout). K is drawn per example from a Pareto law, `K = min(most_turns, floor(U **
(-1 / turns_alpha)))` with U uniform in (0, 1]: P(K >= k) = k ** -turns_alpha. At the defaults (alpha 2, cap 6)
75% of the episodes have one turn, 6.25% four or more and 2.8% the cap (1.49 turns on average): a step of 64
groups almost always holds a group of 4+ turns (98%) and five times in six one of 6 turns and 5 replies, where the
median group has one turn and no reply. Every turn is real generation (a request whose prompt is the conversation
so far), so the long episodes also cost the server and the trainer more tokens.

Reward: the mean over the K strings of `lcs_ratio(reversed string, answer)` (a string the episode never reached,
because a turn was cut by max_tokens or the context, counts 0), so every turn learns the reverse-text task. The
component `first` is the first turn's ratio alone: the policy cannot tell K from the first string, so it measures
the reverse-text skill the same way whatever mix of short and long episodes a batch holds (a continuous batch holds
the episodes that finished first); the benchmark's time to reward reads it.

Everything is drawn from the example stream's seeded RNG (the strings, K), so a seed gives the same episodes in
both rollout modes; the latency is a constant. Loaded by path: `id = "benchmarks/heavy_tail_env.py:HeavyTailReverse"`
(relative to the working directory, or absolute), no PYTHONPATH needed.
"""

from __future__ import annotations

import asyncio
import math
import random
import string
from typing import Any

from prime_rl.envs.environment import (
    EnvReply,
    Example,
    MultiTurnEnvironment,
    Reward,
    Rollout,
    SyntheticEnvironment,
    require,
)
from prime_rl.envs.rewards import lcs_ratio


def pareto_turns(rng: random.Random, alpha: float, most: int) -> int:
    """K with P(K >= k) = k ** -alpha for k <= most (a discrete Pareto law, capped at `most`)."""
    u = 1.0 - rng.random()  # in (0, 1]
    return max(1, min(most, math.floor(u ** (-1.0 / alpha))))


class HeavyTailReverse(MultiTurnEnvironment, SyntheticEnvironment):
    id = "heavy-tail-reverse"
    max_turns = 6

    def __init__(self, min_len: int = 5, max_len: int = 12, turns_alpha: float = 2.0, most_turns: int = 6,
                 reply_latency_s: float = 0.3):
        require(1 <= min_len <= max_len, self.id, f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
        require(turns_alpha > 0, self.id, f"turns_alpha must be > 0, got {turns_alpha}")
        require(most_turns >= 1, self.id, f"most_turns must be >= 1, got {most_turns}")
        require(reply_latency_s >= 0, self.id, f"reply_latency_s must be >= 0, got {reply_latency_s}")
        self.min_len, self.max_len = min_len, max_len
        self.turns_alpha = turns_alpha
        self.max_turns = most_turns  # the orchestrator's cap, unless [[orchestrator.env]] max_turns says otherwise
        self.reply_latency_s = reply_latency_s

    def make_example(self, rng: random.Random) -> Example:
        turns = pareto_turns(rng, self.turns_alpha, self.max_turns)
        texts = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_len, self.max_len)))
                 for _ in range(turns)]
        return Example(prompt=[{"role": "user", "content": texts[0]}], answer=texts[0][::-1],
                       info={"texts": texts, "turns": turns})

    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        texts = example.info["texts"]
        answered = sum(m["role"] == "assistant" for m in messages)
        if answered >= len(texts):
            return EnvReply(done=True)
        if self.reply_latency_s:
            await asyncio.sleep(self.reply_latency_s)
        return EnvReply([{"role": "user", "content": texts[answered]}])

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        texts = example.info["texts"]
        attempts = [str(m["content"]).strip() for m in rollout.messages if m["role"] == "assistant"]
        ratios = [lcs_ratio(text[::-1], attempt) for text, attempt in zip(texts, attempts, strict=False)]
        ratios += [0.0] * (len(texts) - len(ratios))
        return Reward(total=sum(ratios) / len(ratios), components={"first": ratios[0]})

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        texts = example.info["texts"]
        messages = [{"role": "assistant", "content": texts[0][::-1]}]
        for text in texts[1:]:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]
        return messages

"""`reverse-text-hint`: reverse a string in up to two attempts; a wrong first attempt gets a hint.

Prompt: user "<letters>" as in `reverse-text`. The policy answers; an exactly right first
attempt ends the rollout. Otherwise the environment replies with a user message holding
the first `ceil(len / 2)` letters of the reversed string (the hint) and the policy answers
again. Reward: the mean of the two attempts' LCS ratios (`rewards.lcs_ratio`; a right first
attempt counts twice, as it is also the last), so both turns get credit for what they do;
components `first` and `final` (the last attempt's). With a useful hint, `final` beats
`first`: the feedback is what the second turn learns to use.

`demonstration` (what `sft` trains on): with probability `demo_retry_prob` (a per-example
coin, seeded by the text) a flawed first attempt (the answer with 1-3 letters replaced,
marked `"train": false`, so SFT learns to read it but not to write it), the hint, and the
right answer; otherwise just the right answer.
"""

from __future__ import annotations

import math
import random
import string
from typing import Any

from prime_rl.envs.environment import EnvReply, Example, MultiTurnEnvironment, Reward, Rollout, require
from prime_rl.envs.registry import register_env
from prime_rl.envs.reverse_text import ReverseTextEnv
from prime_rl.envs.rewards import lcs_ratio


def hint(answer: str) -> str:
    """The first ceil(len / 2) letters of the answer."""
    return answer[: math.ceil(len(answer) / 2)]


@register_env
class ReverseTextHintEnv(ReverseTextEnv, MultiTurnEnvironment):
    id = "reverse-text-hint"
    max_turns = 2

    def __init__(self, min_len: int = 5, max_len: int = 12, system_prompt: str = "", demo_retry_prob: float = 0.75):
        super().__init__(min_len, max_len, system_prompt)
        require(0 <= demo_retry_prob <= 1, self.id, f"demo_retry_prob must be in [0, 1], got {demo_retry_prob}")
        self.demo_retry_prob = demo_retry_prob

    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        if messages[-1]["content"].strip() == example.answer:
            return EnvReply(done=True)
        return EnvReply([{"role": "user", "content": hint(example.answer)}])

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        attempts = [str(m["content"]).strip() for m in rollout.messages if m["role"] == "assistant"]
        first, final = (lcs_ratio(example.answer, attempts[i]) if attempts else 0.0 for i in (0, -1))
        return Reward(total=(first + final) / 2, components={"first": first, "final": final})

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        answer = example.answer
        rng = random.Random(example.info["text"])
        if rng.random() >= self.demo_retry_prob:
            return [{"role": "assistant", "content": answer}]
        flawed = list(answer)
        for i in rng.sample(range(len(answer)), k=min(len(answer), rng.randint(1, 3))):
            flawed[i] = rng.choice([c for c in string.ascii_lowercase if c != answer[i]])
        return [{"role": "assistant", "content": "".join(flawed), "train": False},
                {"role": "user", "content": hint(answer)},
                {"role": "assistant", "content": answer}]

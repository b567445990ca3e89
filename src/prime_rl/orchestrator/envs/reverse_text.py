"""`reverse-text`: reverse a short random lowercase string.

Prompt: system "Reverse the text." + user "<letters>" (kept short: the default tokenizer
is character-level, so every prompt character is a token). Answer: the reversed string.
Reward: `lcs_ratio(answer, completion.strip())` = 2 * LCS / (len(answer) + len(completion)).
"""

from __future__ import annotations

import random
import string

from prime_rl.orchestrator.envs.base import Example, Reward, SyntheticEnvironment, require
from prime_rl.orchestrator.envs.rewards import lcs_ratio

SYSTEM_PROMPT = "Reverse the text."


class ReverseTextEnv(SyntheticEnvironment):
    id = "reverse-text"

    def __init__(self, min_len: int = 5, max_len: int = 12):
        require(1 <= min_len <= max_len, self.id, f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        self.min_len, self.max_len = min_len, max_len

    def make_example(self, rng: random.Random) -> Example:
        text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_len, self.max_len)))
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]
        return Example(prompt=prompt, answer=text[::-1], info={"text": text})

    async def score(self, example: Example, completion: str) -> Reward:
        ratio = lcs_ratio(example.answer, completion.strip())
        return Reward(total=ratio, components={"lcs_ratio": ratio})

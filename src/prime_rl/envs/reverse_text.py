"""`reverse-text`: reverse a short random lowercase string.

Prompt: user "<letters>", after a system message `system_prompt` when one is given (e.g.
"Reverse the text." for a pretrained LLM). None by default: the embedded character-level
model is trained without it, since every prompt character is a token and the instruction
would double the tokens per sample. Answer: the reversed string.
Reward: `lcs_ratio(answer, completion.strip())` = 2 * LCS / (len(answer) + len(completion)).
"""

from __future__ import annotations

import random
import string

from prime_rl.envs.environment import Example, Reward, SyntheticEnvironment, chat_prompt, require
from prime_rl.envs.registry import register_env
from prime_rl.envs.rewards import lcs_ratio


@register_env
class ReverseTextEnv(SyntheticEnvironment):
    id = "reverse-text"

    def __init__(self, min_len: int = 5, max_len: int = 12, system_prompt: str = ""):
        require(1 <= min_len <= max_len, self.id,
                f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        self.min_len, self.max_len = min_len, max_len
        self.system_prompt = system_prompt

    def make_example(self, rng: random.Random) -> Example:
        text = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_len, self.max_len)))
        return Example(prompt=chat_prompt(self.system_prompt, text), answer=text[::-1], info={"text": text})

    async def score(self, example: Example, completion: str) -> Reward:
        ratio = lcs_ratio(example.answer, completion.strip())
        return Reward(total=ratio, components={"lcs_ratio": ratio})

"""`alphabet-sort`: sort a few random lowercase words alphabetically.

Prompt: system `system_prompt` ["Sort the words alphabetically."; "" leaves it out] + user
"<w1> <w2> ...". Answer: the words sorted, joined by single spaces. Reward (partial credit): the LCS ratio over *words*,
2 * LCS(answer_words, completion_words) / (n_answer + n_completion): each word in the
right relative order counts, missing or extra words cost. Component `exact` is 1 for a
perfect answer.
"""

from __future__ import annotations

import random
import string

from prime_rl.envs.environment import Example, Reward, SyntheticEnvironment, chat_prompt, require
from prime_rl.envs.registry import register_env
from prime_rl.envs.rewards import lcs_ratio

SYSTEM_PROMPT = "Sort the words alphabetically."


@register_env
class AlphabetSortEnv(SyntheticEnvironment):
    id = "alphabet-sort"

    def __init__(self, min_words: int = 3, max_words: int = 5, min_word_len: int = 3, max_word_len: int = 6,
                 system_prompt: str = SYSTEM_PROMPT):
        require(2 <= min_words <= max_words, self.id, f"need 2 <= min_words <= max_words, got {min_words}, {max_words}")
        require(
            1 <= min_word_len <= max_word_len, self.id,
            f"need 1 <= min_word_len <= max_word_len, got {min_word_len}, {max_word_len}",
        )
        self.min_words, self.max_words = min_words, max_words
        self.min_word_len, self.max_word_len = min_word_len, max_word_len
        self.system_prompt = system_prompt

    def make_example(self, rng: random.Random) -> Example:
        count = rng.randint(self.min_words, self.max_words)
        words: list[str] = []
        while len(words) < count:  # distinct words, so the sorted answer is unique
            word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(self.min_word_len, self.max_word_len)))
            if word not in words:
                words.append(word)
        return Example(prompt=chat_prompt(self.system_prompt, " ".join(words)), answer=" ".join(sorted(words)),
                       info={"words": words})

    async def score(self, example: Example, completion: str) -> Reward:
        answer_words, got_words = example.answer.split(), completion.split()
        ratio = lcs_ratio(answer_words, got_words)
        exact = float(got_words == answer_words)
        return Reward(total=ratio, components={"lcs_ratio": ratio, "exact": exact})

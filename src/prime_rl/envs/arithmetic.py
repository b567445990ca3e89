"""`arithmetic`: small integer sums and products, exact-match reward.

Prompt: system `system_prompt` ["Compute."; "" leaves it out] + user "a+b" or "a*b" with
0 <= a, b <= max_operand. Answer: the decimal result. Reward: 1 if the stripped completion equals the answer, else 0.
"""

from __future__ import annotations

import random

from prime_rl.envs.environment import Example, Reward, SyntheticEnvironment, chat_prompt, require
from prime_rl.envs.registry import register_env

SYSTEM_PROMPT = "Compute."
OPERATORS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b, "-": lambda a, b: a - b}


@register_env
class ArithmeticEnv(SyntheticEnvironment):
    id = "arithmetic"

    def __init__(self, max_operand: int = 20, operators: str = "+*", system_prompt: str = SYSTEM_PROMPT):
        require(max_operand >= 1, self.id, f"max_operand must be >= 1, got {max_operand}")
        bad = sorted(set(operators) - set(OPERATORS))
        require(
            bool(operators) and not bad, self.id,
            f"operators must be a non-empty string of {''.join(OPERATORS)}, got {operators!r}",
        )
        self.max_operand, self.operators, self.system_prompt = max_operand, operators, system_prompt

    def make_example(self, rng: random.Random) -> Example:
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        op = rng.choice(self.operators)
        question = f"{a}{op}{b}"
        return Example(prompt=chat_prompt(self.system_prompt, question), answer=str(OPERATORS[op](a, b)),
                       info={"a": a, "b": b, "op": op})

    async def score(self, example: Example, completion: str) -> Reward:
        exact = float(completion.strip() == example.answer)
        return Reward(total=exact, components={"exact_match": exact})

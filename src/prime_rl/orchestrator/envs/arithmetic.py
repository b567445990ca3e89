"""`arithmetic`: small integer sums and products, exact-match reward.

Prompt: system "Compute." + user "a+b" or "a*b" with 0 <= a, b <= max_operand. Answer:
the decimal result. Reward: 1 if the stripped completion equals the answer, else 0.
"""

from __future__ import annotations

import random

from prime_rl.orchestrator.envs.base import Example, Reward, SyntheticEnvironment, require

SYSTEM_PROMPT = "Compute."
OPERATORS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b, "-": lambda a, b: a - b}


class ArithmeticEnv(SyntheticEnvironment):
    id = "arithmetic"

    def __init__(self, max_operand: int = 20, operators: str = "+*"):
        require(max_operand >= 1, self.id, f"max_operand must be >= 1, got {max_operand}")
        bad = sorted(set(operators) - set(OPERATORS))
        require(
            bool(operators) and not bad, self.id,
            f"operators must be a non-empty string of {''.join(OPERATORS)}, got {operators!r}",
        )
        self.max_operand, self.operators = max_operand, operators

    def make_example(self, rng: random.Random) -> Example:
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        op = rng.choice(self.operators)
        question = f"{a}{op}{b}"
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        return Example(prompt=prompt, answer=str(OPERATORS[op](a, b)), info={"a": a, "b": b, "op": op})

    async def score(self, example: Example, completion: str) -> Reward:
        exact = float(completion.strip() == example.answer)
        return Reward(total=exact, components={"exact_match": exact})

"""A verifiers 0.4 tool taskset that the embedded `tiny-calculator` model actually calls: products `a*b` (the prompts
of prime-rl's `calculator` environment, which that model was trained on) with a bare `multiply` tool, loaded by its
verifiers id `verifiers_calculator` (the tests put `tests/support/tasksets/` on sys.path and the `rl` processes'
PYTHONPATH). Importable only with the extra."""

from __future__ import annotations

import random

import verifiers.v1 as vf


class ProductData(vf.TaskData):
    answer: str = ""


class Calculator(vf.Toolset):
    TOOL_PREFIX = None  # offered bare, as `multiply`: the name tiny-calculator calls

    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        return a * b


class ProductTask(vf.Task[ProductData]):
    @classmethod
    def toolsets(cls, config):
        return [Calculator(vf.ToolsetConfig())]

    @vf.reward
    async def exact(self, task, trace) -> float:
        """1 when the last reply is the product."""
        return float(trace.last_reply.strip() == task.answer)


class ProductTaskset(vf.Taskset[ProductTask]):
    def load(self):
        rng = random.Random(0)
        for _ in range(32):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            yield ProductTask(ProductData(prompt=f"{a}*{b}", answer=str(a * b)), self.config.task)


__all__ = ["ProductTaskset"]

"""`calculator`: products of two multi-digit numbers, with `multiply` and `add` tools.

Prompt: system `system_prompt` ("" leaves it out) + user "a*b" with `min_operand <= a, b <=
max_operand`. Answer: the decimal product. Reward: 1 if the final answer (the last
assistant message with its tool-call blocks removed, stripped) equals the product, else 0;
`tool_used` (logged, not in the total) is 1 when a tool call of the rollout ran.

The ideal conversation (`demonstration`, what `sft` trains on) calls `multiply`, reads the
result and answers it:

    assistant: <tool_call>\\n{"name": "multiply", "arguments": {"a": 123, "b": 45}}\\n</tool_call>
    tool:      5535
    assistant: 5535

Every text is short printable ASCII, which the embedded character-level models can learn.
Their chat template does not render the `tools` list, so a model learns of the tools from the
demonstrations; a pretrained model whose template ignores `tools` needs them described in
`system_prompt`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from prime_rl.chat.tool_calls import parse_tool_calls
from prime_rl.envs.environment import Example, Reward, Rollout, SyntheticEnvironment, chat_prompt, require
from prime_rl.envs.registry import register_env
from prime_rl.envs.tools import ERROR, ToolEnvironment


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first term.
        b: The second term.
    """
    return a + b


@register_env
class CalculatorEnv(ToolEnvironment, SyntheticEnvironment):
    id = "calculator"

    def __init__(self, min_operand: int = 10, max_operand: int = 999, max_turns: int = 3, system_prompt: str = "",
                 tool_timeout_s: float = 5.0, max_tool_output_chars: int = 2000):
        require(0 <= min_operand <= max_operand, self.id,
                f"need 0 <= min_operand <= max_operand, got {min_operand} and {max_operand}")
        super().__init__(max_turns, tool_timeout_s, max_tool_output_chars)
        self.min_operand, self.max_operand, self.system_prompt = min_operand, max_operand, system_prompt

    def tool_functions(self) -> list[Callable[..., Any]]:
        return [multiply, add]

    def make_example(self, rng: random.Random) -> Example:
        a, b = (rng.randint(self.min_operand, self.max_operand) for _ in range(2))
        return Example(prompt=chat_prompt(self.system_prompt, f"{a}*{b}"), answer=str(a * b), info={"a": a, "b": b})

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        """Call `multiply` on the two operands, then answer the result."""
        arguments = {"a": example.info["a"], "b": example.info["b"]}
        return [*self.tool_call_turn("multiply", arguments), {"role": "assistant", "content": example.answer}]

    async def score(self, example: Example, completion: str) -> Reward:
        """Exact match of the final answer (`completion` with its tool-call blocks removed, stripped)."""
        exact = float(parse_tool_calls(completion).content == example.answer)
        return Reward(total=exact, components={"exact_match": exact})

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        """`score` of the last assistant message, and `tool_used`: whether a tool call ran."""
        reward = await self.score(example, rollout.completion)
        used = float(any(m.get("role") == "tool" and not str(m.get("content", "")).startswith(ERROR)
                         for m in rollout.messages))
        return Reward(total=reward.total, components={**reward.components, "tool_used": used})

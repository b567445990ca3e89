"""The environment protocol: a dataset of examples plus an async reward function.

An environment has an `id`, yields `Example`s (chat prompt messages, the reference
answer, free-form info) from `examples(seed)` (an infinite, deterministic iterator),
and scores a completion with `await score(example, completion_text) -> Reward`.
`Reward.total` is the scalar the advantages are computed from (in [0, 1] for the
built-ins); `Reward.components` are named parts logged as `reward/<env>/<name>`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prime_rl.utils.errors import UserError


@dataclass(frozen=True)
class Example:
    """One prompt: chat messages ({"role", "content"} dicts), the reference answer, extra info."""

    prompt: list[dict[str, str]]
    answer: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reward:
    """A completion's score: `total` trains, `components` are logged."""

    total: float
    components: dict[str, float] = field(default_factory=dict)


class Environment(ABC):
    """What the orchestrator samples prompts from and scores completions with."""

    id: str

    @abstractmethod
    def examples(self, seed: int = 0) -> Iterator[Example]:
        """An infinite iterator of examples; the same seed gives the same sequence."""

    @abstractmethod
    async def score(self, example: Example, completion: str) -> Reward:
        """Score one completion text (special tokens already removed) of `example`."""


class SyntheticEnvironment(Environment):
    """An environment whose examples are generated from a seeded `random.Random`.

    Subclasses implement `make_example(rng)`; `examples(seed)` calls it forever with one
    RNG seeded by `seed`, so the n-th example of a seed never changes (resume skips ahead).
    """

    @abstractmethod
    def make_example(self, rng: random.Random) -> Example:
        """Draw one example."""

    def examples(self, seed: int = 0) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.make_example(rng)


def chat_prompt(system_prompt: str, user: str) -> list[dict[str, str]]:
    """A user message, after a system message when `system_prompt` is not empty."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*system, {"role": "user", "content": user}]


def require(condition: bool, env_id: str, message: str) -> None:
    """Argument check for environment constructors: a one-line UserError naming the env."""
    if not condition:
        raise UserError(f"environment '{env_id}': {message}")

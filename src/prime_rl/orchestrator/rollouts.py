"""Drawing prompts from the configured environments and turning them into scored groups.

A *group* is one example with the `n` completions the server returned for it, each
scored by the example's environment. `ExampleSource` draws examples: each draw picks an
environment with probability weight / sum(weights) (one seeded RNG) and takes that
environment's next example; how many each environment has yielded (its cursor) and the
RNG state are what a checkpoint stores.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from prime_rl.envs import Environment, Example, load_env
from prime_rl.orchestrator.client import ChatResult, InferenceClient
from prime_rl.orchestrator.config import EnvConfig


@dataclass
class Group:
    env: str  # the environment's metric name
    example: Example
    result: ChatResult
    rewards: list[float]
    components: list[dict[str, float]]


@dataclass
class Draw:
    env: str
    environment: Environment
    example: Example


class ExampleSource:
    """Weighted, seeded, resumable draws of examples from several environments."""

    def __init__(self, configs: list[EnvConfig], seed: int, cursors: dict[str, int] | None = None,
                 rng: random.Random | None = None):
        self.names = [c.metric_name for c in configs]
        self.weights = [c.weight for c in configs]
        self.envs = {c.metric_name: load_env(c.id, **c.args) for c in configs}
        self.cursors = {name: 0 for name in self.names}
        self.iterators: dict[str, Iterator[Example]] = {}
        for i, name in enumerate(self.names):
            # Each environment has its own example stream; a resumed run skips what was drawn.
            skip = (cursors or {}).get(name, 0)
            self.iterators[name] = itertools.islice(self.envs[name].examples(seed=seed + i), skip, None)
            self.cursors[name] = skip
        self.rng = rng or random.Random(seed)

    def draw(self, count: int) -> list[Draw]:
        draws = []
        for _ in range(count):
            name = self.rng.choices(self.names, weights=self.weights)[0] if len(self.names) > 1 else self.names[0]
            self.cursors[name] += 1
            draws.append(Draw(name, self.envs[name], next(self.iterators[name])))
        return draws


def request_seed(seed: int, step: int, index: int) -> int:
    """A per-request sampling seed, so a (resumed) run's rollouts repeat given the same weights."""
    return ((seed * 1_000_003 + step) * 100_003 + index * 1_009) % (2**31 - 1)


async def score_group(draw: Draw, result: ChatResult, truncated_reward: float | None = None) -> Group:
    """Score every completion with the environment; a truncated one gets `truncated_reward` if set."""
    rewards = await asyncio.gather(*(draw.environment.score(draw.example, c.text) for c in result.completions))
    totals = [
        truncated_reward if truncated_reward is not None and c.truncated else r.total
        for c, r in zip(result.completions, rewards, strict=True)
    ]
    return Group(draw.env, draw.example, result, totals, [r.components for r in rewards])


async def generate_groups(client: InferenceClient, draws: list[Draw], n: int, temperature: float, top_p: float,
                          max_tokens: int, seeds: list[int | None], truncated_reward: float | None = None,
                          ) -> list[Group]:
    """Ask for `n` completions of every draw (bounded by the client's concurrency) and score them."""

    async def one(draw: Draw, seed: int | None) -> Group:
        result = await client.chat(draw.example.prompt, n, temperature, top_p, max_tokens, seed)
        return await score_group(draw, result, truncated_reward)

    return list(await asyncio.gather(*(one(d, s) for d, s in zip(draws, seeds, strict=True))))

"""Drawing prompts from the configured environments and turning them into scored groups.

A *group* is one example with the `n` completions the server returned for it, each
scored by the example's environment. A `score` call that raises or outlasts the
environment's `score_timeout_s` scores 0 with a warning line naming the example (the first
WARN_FIRST per environment, then the 10th, 100th, ...), or, with `on_error = "fail"`, ends
the run with that line: an environment's bug never crashes the orchestrator with a traceback. `ExampleSource` draws examples: each draw picks an
environment with probability weight / sum(weights) (one seeded RNG) and takes that
environment's next example; how many each environment has yielded (its cursor) and the
RNG state are what a checkpoint stores.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from prime_rl.envs import Environment, Example, Reward, load_env
from prime_rl.orchestrator.client import ChatResult, InferenceClient
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")
WARN_FIRST = 5  # failed scorings logged one line each per environment; after that only the 10th, 100th, ...
_failures: collections.Counter[str] = collections.Counter()


@dataclass
class Group:
    env: str  # the environment's metric name
    example: Example
    result: ChatResult
    rewards: list[float]
    components: list[dict[str, float]]
    errors: list[str | None] = field(default_factory=list)  # per completion: why scoring failed (None: it did not)


@dataclass
class Draw:
    env: str
    environment: Environment
    example: Example
    config: EnvConfig = field(default_factory=EnvConfig)  # score_timeout_s, on_error


class EnvironmentFailed(UserError):
    """Scoring a rollout raised or timed out, and its environment's on_error is "fail"."""


class ExampleSource:
    """Weighted, seeded, resumable draws of examples from several environments."""

    def __init__(self, configs: list[EnvConfig], seed: int, cursors: dict[str, int] | None = None,
                 rng: random.Random | None = None):
        self.names = [c.metric_name for c in configs]
        self.configs = {c.metric_name: c for c in configs}
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
            draws.append(Draw(name, self.envs[name], next(self.iterators[name]), self.configs[name]))
        return draws


def request_seed(seed: int, step: int, index: int) -> int:
    """A per-request sampling seed, so a (resumed) run's rollouts repeat given the same weights."""
    return ((seed * 1_000_003 + step) * 100_003 + index * 1_009) % (2**31 - 1)


async def score_one(draw: Draw, completion: str) -> tuple[Reward, str | None]:
    """(the environment's reward, None), or (0, why) when `score` raised or took longer than
    `score_timeout_s` and the environment's `on_error` is "zero" (one warning line naming the example)."""
    timeout = draw.config.score_timeout_s
    try:
        return await asyncio.wait_for(draw.environment.score(draw.example, completion), timeout), None
    except TimeoutError:
        why = f"score took longer than score_timeout_s = {timeout:g}s"
    except Exception as exc:  # an environment's bug must not end the run unless asked to
        why = f"score raised {type(exc).__name__}: {str(exc)[:300]}"
    prompt = json.dumps(draw.example.prompt[-1]["content"] if draw.example.prompt else "")[:200]
    message = f"environment '{draw.env}': {why} (example prompt {prompt}, answer {json.dumps(draw.example.answer)[:100]})"
    if draw.config.on_error == "fail":
        raise EnvironmentFailed(message)
    _failures[draw.env] += 1
    count = _failures[draw.env]
    if count <= WARN_FIRST or math.log10(count).is_integer():  # the first few, then the 10th, 100th, ...
        log.warning(f"{message}: the rollout scores 0 (failure {count} of this environment; rollout/env_error_frac)")
    return Reward(0.0), why


async def score_group(draw: Draw, result: ChatResult, truncated_reward: float | None = None) -> Group:
    """Score every completion with the environment; a truncated one gets `truncated_reward` if set."""
    scored = await asyncio.gather(*(score_one(draw, c.text) for c in result.completions))
    totals = [
        truncated_reward if truncated_reward is not None and c.truncated else r.total
        for c, (r, _) in zip(result.completions, scored, strict=True)
    ]
    return Group(draw.env, draw.example, result, totals, [r.components for r, _ in scored], [e for _, e in scored])


async def generate_groups(client: InferenceClient, draws: list[Draw], n: int, temperature: float, top_p: float,
                          max_tokens: int, seeds: list[int | None], truncated_reward: float | None = None,
                          ) -> list[Group]:
    """Ask for `n` completions of every draw (bounded by the client's concurrency) and score them."""

    async def one(draw: Draw, seed: int | None) -> Group:
        result = await client.chat(draw.example.prompt, n, temperature, top_p, max_tokens, seed)
        return await score_group(draw, result, truncated_reward)

    return list(await asyncio.gather(*(one(d, s) for d, s in zip(draws, seeds, strict=True))))

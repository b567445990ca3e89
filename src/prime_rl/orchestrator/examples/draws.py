"""What a rollout starts from: a *draw*, one example of one environment with that environment's config, and the
stream of draws a run takes.

`ExampleSource` owns the drawing: each draw picks an environment with probability weight / sum(weights) (one
seeded RNG) and takes that environment's next example; with `[orchestrator.curriculum]`, an environment under the
curriculum instead gives the example its `Curriculum` draws from its pool by pass rate (`curriculum.py`). How many
each environment has yielded (its cursor), the RNG state and the curriculum's state are what a checkpoint stores,
so a resumed run goes on with the examples it has not drawn yet.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from prime_rl.envs import Environment, Example
from prime_rl.orchestrator.config import CurriculumConfig, EnvConfig
from prime_rl.orchestrator.examples.curriculum import Curriculum, example_pools


@dataclass
class Draw:
    """One drawn example, with the environment that scores it and that environment's config."""

    env: str  # the environment's metric name
    environment: Environment
    example: Example
    config: EnvConfig = field(default_factory=EnvConfig)  # score_timeout_s, respond_timeout_s, max_turns, on_error


class ExampleSource:
    """Weighted, seeded, resumable draws of examples from several environments; `curriculum` (with a checkpoint's
    `curriculum_state`) draws the examples of the environments it applies to."""

    def __init__(self, configs: list[EnvConfig], seed: int, cursors: dict[str, int] | None = None,
                 rng: random.Random | None = None, curriculum: CurriculumConfig | None = None,
                 curriculum_state: dict | None = None):
        self.names = [c.metric_name for c in configs]
        self.configs = {c.metric_name: c for c in configs}
        self.weights = [c.weight for c in configs]
        self.envs = {c.metric_name: c.build() for c in configs}
        self.cursors = {name: 0 for name in self.names}
        self.iterators: dict[str, Iterator[Example]] = {}
        for i, name in enumerate(self.names):
            # Each environment has its own example stream; a resumed run skips what was drawn.
            skip = (cursors or {}).get(name, 0)
            self.iterators[name] = itertools.islice(self.envs[name].examples(seed=seed + i), skip, None)
            self.cursors[name] = skip
        self.rng = rng or random.Random(seed)
        self.curriculum = None if curriculum is None else Curriculum(
            curriculum, example_pools(self.envs, curriculum), dict(zip(self.names, self.weights, strict=True)), seed,
            curriculum_state)

    def draw(self, count: int) -> list[Draw]:
        draws = []
        for _ in range(count):
            name = self.rng.choices(self.names, weights=self.weights)[0] if len(self.names) > 1 else self.names[0]
            self.cursors[name] += 1
            curriculum = self.curriculum is not None and self.curriculum.applies_to(name)
            example = self.curriculum.draw(name) if curriculum else next(self.iterators[name])
            draws.append(Draw(name, self.envs[name], example, self.configs[name]))
        return draws

"""The online curriculum (`[orchestrator.curriculum]`): draws an environment's examples by how recently they were
solved, so that examples whose groups teach nothing come up less often.

A group whose rollouts all pass, or all fail, has equal rewards and so zero advantage under the group baselines: it
costs a request and trains nothing. The curriculum keeps, for every example of a finite pool with ids
(`Environment.example_pool()`: the `dataset` environment's rows), its last `window` scored groups, and from them
its pass rate

    rate_i = (rollouts of i that passed, reward >= pass_threshold) / (rollouts of i)   over its last `window` groups

(failed rollouts, `Group.errors`, count in neither: a failure says how the environment fared). The rate puts the
example in a pool, and the pool sets its sampling weight:

    unseen (no group yet)       w_i = unseen_weight
    easy   rate_i >= easy_rate  w_i = easy_weight
    hard   rate_i <= hard_rate  w_i = hard_weight
    otherwise                   w_i = 1

A draw from the environment (which environment: `ExampleSource`, by the environments' weights as always) picks
example i with probability w_i / sum_j w_j; when every weight of the pool is 0 it draws uniformly (one warning). So
once every example of a pool of E easy, H hard and M other examples has been seen, an easy one is drawn with
probability E * easy_weight / (E * easy_weight + H * hard_weight + M), which `curriculum/easy_prob` reports.

Draws use the curriculum's own seeded RNG (`random.Random(f"{seed}:curriculum")`, one for all its
environments) through the cumulative weights, recomputed when a step's groups change them; the rates change
only in `observe`, which the orchestrator calls with each step's collected groups before it snapshots the
checkpoint state. `state()` (the RNG and every seen example's window) goes into the orchestrator's checkpoint,
so a resumed run weighs and draws exactly as an uninterrupted one (in step mode, whose draws are made in order;
continuous mode skips its in-flight draws on resume anyway).

Groups are matched to their example by identity: the pool's `Example` objects are the ones drawn, carried by
each `Group` (`Group.example`), so no id travels through the rollouts.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prime_rl.envs import Environment, Example
from prime_rl.orchestrator.config import CurriculumConfig, no_example_ids
from prime_rl.utils.errors import UserError
from prime_rl.utils.json_state import python_rng_from_json, python_rng_to_json
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")

LEVELS = ("unseen", "easy", "hard", "normal")


class Scored(Protocol):
    """What `observe` reads of a group (`rollouts.Group` is one)."""

    env: str
    example: Example
    rewards: list[float]
    errors: list[str | None]


@dataclass
class Pool:
    """One environment's examples under the curriculum: their windows and sampling weights."""

    examples: Sequence[Example]
    ids: dict[int, int]  # id(example object) -> its example id
    history: dict[int, deque[tuple[int, int]]] = field(default_factory=dict)  # id -> (passed, scored) per group
    weights: list[float] = field(default_factory=list)
    cumulative: list[float] | None = None  # None: stale (the weights changed since)
    last: int = 0  # the last example with a positive weight (a draw never lands past it)

    def refresh(self) -> None:
        self.cumulative = list(itertools.accumulate(self.weights))
        self.last = next((i for i in range(len(self.weights) - 1, -1, -1) if self.weights[i] > 0), 0)


class Curriculum:
    """The curriculum over `pools` (environment name -> its `example_pool()`); `state` restores a checkpoint's
    (`state()`)."""

    def __init__(self, config: CurriculumConfig, pools: dict[str, Sequence[Example]], env_weights: dict[str, float],
                 seed: int, state: dict[str, Any] | None = None):
        self.config = config
        self.share = {name: env_weights[name] / sum(env_weights[n] for n in pools) for name in pools}
        self.pools: dict[str, Pool] = {}
        for name, examples in pools.items():
            ids = {id(example): i for i, example in enumerate(examples)}
            if len(ids) != len(examples):
                raise UserError(f"curriculum: environment '{name}' has the same Example object at two ids of its "
                                "example_pool(): give each id its own")
            self.pools[name] = Pool(examples, ids, weights=[config.unseen_weight] * len(examples))
        self.rng = random.Random(f"{seed}:curriculum")
        self.warned: set[str] = set()
        if state is not None:
            self._restore(state)

    def applies_to(self, env: str) -> bool:
        return env in self.pools

    def draw(self, env: str) -> Example:
        """The next example of `env` (module docstring)."""
        pool = self.pools[env]
        if pool.cumulative is None:
            pool.refresh()
        total = pool.cumulative[-1]
        if total > 0:
            index = bisect.bisect_right(pool.cumulative, self.rng.random() * total, 0, pool.last)
        else:
            if env not in self.warned:
                self.warned.add(env)
                log.warning(f"curriculum: every example of environment '{env}' weighs 0 (easy_weight, hard_weight "
                            "or unseen_weight): drawing uniformly")
            index = self.rng.randrange(len(pool.examples))
        return pool.examples[index]

    def observe(self, groups: Iterable[Scored]) -> None:
        """Add each group to its example's window, in order (groups of other environments are ignored)."""
        for group in groups:
            pool = self.pools.get(group.env)
            index = pool.ids.get(id(group.example)) if pool is not None else None
            if index is None:
                continue
            ok = [reward for i, reward in enumerate(group.rewards)
                  if i >= len(group.errors) or group.errors[i] is None]
            if not ok:
                continue  # every rollout failed: nothing about the example
            passed = sum(reward >= self.config.pass_threshold for reward in ok)
            self._record(pool, index, passed, len(ok))

    def _record(self, pool: Pool, index: int, passed: int, scored: int) -> None:
        window = pool.history.setdefault(index, deque(maxlen=self.config.window))
        window.append((passed, scored))
        pool.weights[index] = self.weight(self.level(window))
        pool.cumulative = None

    def level(self, window: Sequence[tuple[int, int]] | None) -> str:
        """unseen, easy, hard or normal: the pool of an example with this window."""
        if not window:
            return "unseen"
        rate = sum(p for p, _ in window) / sum(n for _, n in window)
        c = self.config
        return "easy" if rate >= c.easy_rate else "hard" if rate <= c.hard_rate else "normal"

    def weight(self, level: str) -> float:
        c = self.config
        return {"unseen": c.unseen_weight, "easy": c.easy_weight, "hard": c.hard_weight, "normal": 1.0}[level]

    def metrics(self) -> dict[str, float]:
        """`curriculum/*`: the pools' sizes, the share of their examples in each pool, and the probability that the
        next draw for a curriculum environment is an easy (hard) example, the environments mixed by their weights."""
        size = sum(len(p.examples) for p in self.pools.values())
        counts = dict.fromkeys(LEVELS, 0)
        prob = dict.fromkeys(("easy", "hard"), 0.0)
        for name, pool in self.pools.items():
            count, mass = dict.fromkeys(LEVELS, 0), dict.fromkeys(LEVELS, 0.0)
            for index, window in pool.history.items():
                level = self.level(window)
                count[level] += 1
                mass[level] += pool.weights[index]
                counts[level] += 1
            total = sum(pool.weights)
            for level in prob:  # every weight 0: uniform draws, so the level's share of the examples
                share = mass[level] / total if total > 0 else count[level] / len(pool.examples)
                prob[level] += self.share[name] * share
        return {
            "curriculum/pool_size": float(size),
            "curriculum/easy_frac": counts["easy"] / size,
            "curriculum/hard_frac": counts["hard"] / size,
            "curriculum/unseen_frac": (size - sum(counts.values())) / size,  # a seen example's window is never empty
            "curriculum/easy_prob": prob["easy"],
            "curriculum/hard_prob": prob["hard"],
        }

    def state(self) -> dict[str, Any]:
        """The checkpoint's part: the RNG and, per environment, its pool size and every seen example's window."""
        return {
            "rng": python_rng_to_json(self.rng.getstate()),
            "envs": {name: {"size": len(pool.examples),
                            "history": {str(i): [list(g) for g in window] for i, window in pool.history.items()}}
                     for name, pool in self.pools.items()},
        }

    def _restore(self, state: dict[str, Any]) -> None:
        """A checkpoint's `state()`: its RNG, and the windows of the environments still under the curriculum (one
        newly under it starts unseen; a smaller `window` keeps each example's latest groups)."""
        self.rng.setstate(python_rng_from_json(state["rng"]))
        for name, saved in state["envs"].items():
            pool = self.pools.get(name)
            if pool is None:
                continue
            if saved["size"] != len(pool.examples):
                raise UserError(f"curriculum: the checkpoint's environment '{name}' had {saved['size']} examples, "
                                f"its pool now has {len(pool.examples)}: the example ids changed (the data set?)")
            for key, window in saved["history"].items():
                for passed, scored in window:
                    self._record(pool, int(key), passed, scored)


def state_problem(state: Any) -> str | None:
    """What makes `state` other than a `Curriculum.state()` (None: nothing); the RNG state is checked when loaded."""
    if not isinstance(state, dict) or set(state) != {"rng", "envs"} or not isinstance(state["envs"], dict):
        return "curriculum is not {rng, envs}"
    for name, saved in state["envs"].items():
        if not isinstance(saved, dict) or set(saved) != {"size", "history"} or not isinstance(saved["history"], dict):
            return f"curriculum.envs.{name} is not {{size, history}}"
        size = saved["size"]
        if not _count(size) or size < 1:
            return f"curriculum.envs.{name}.size = {size!r} is not a pool size"
        for key, window in saved["history"].items():
            if not (key.isascii() and key.isdigit() and int(key) < size):
                return f"curriculum.envs.{name}.history has example id {key!r} outside 0..{size - 1}"
            if not isinstance(window, list) or not window or not all(
                    isinstance(g, list) and len(g) == 2 and _count(g[0]) and _count(g[1]) and g[0] <= g[1] and g[1]
                    for g in window):
                return f"curriculum.envs.{name}.history[{key}] = {window!r:.80} is not a list of [passed, scored]"
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def example_pools(envs: dict[str, Environment], config: CurriculumConfig) -> dict[str, Sequence[Example]]:
    """The pools of the environments `config` applies to (every one when `config.envs` is none); one whose
    `example_pool()` is None or empty is a one-line `UserError` (a verifiers id, which only the run makes)."""
    pools = {}
    for name, env in envs.items():
        if config.envs is None or name in config.envs:
            pool = env.example_pool()
            if not pool:
                raise UserError(no_example_ids(name, config.envs is None))
            pools[name] = pool
    return pools

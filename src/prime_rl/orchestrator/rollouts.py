"""Drawing prompts from the configured environments and turning them into scored groups.

A *group* is one example with its `n` rollouts, each scored by the example's environment
(`score_rollout`, or `score_group` for all `n` at once). A single-turn rollout is one chat
completion; a multi-turn one is a conversation run token-in, token-out
(`orchestrator/conversation.py`). An environment call (`respond`, `score_rollout`,
`score_group`) that raises or outlasts its timeout fails the rollout (a whole group, for
`score_group`): it scores 0 with a warning line naming the example (the first WARN_FIRST
per environment, then the 10th, 100th, ...), or, with `on_error = "fail"`, ends the run with
that line: an environment's bug never crashes the orchestrator with a traceback.
`ExampleSource` draws examples: each draw picks an
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
from typing import TYPE_CHECKING, Any

from prime_rl.envs import Environment, Example, Reward, load_env
from prime_rl.envs.base import Rollout
from prime_rl.orchestrator.client import ChatResult, InferenceClient
from prime_rl.orchestrator.config import EnvConfig, ReasoningConfig
from prime_rl.orchestrator.reasoning import split_reasoning
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger
from prime_rl.utils.sampling_rule import SamplingRule

if TYPE_CHECKING:
    from prime_rl.orchestrator.conversation import ConversationRunner

log = get_logger("orchestrator")
WARN_FIRST = 5  # failed scorings logged one line each per environment; after that only the 10th, 100th, ...
_failures: collections.Counter[str] = collections.Counter()
_unsampleable: collections.Counter[str] = collections.Counter()  # rollouts cut by `cut_unsampleable`


@dataclass
class TurnStats:
    """How one rollout's conversation went (all 1/0 for a single-turn rollout)."""

    turns: int = 1  # policy turns
    sampled_tokens: int = 0  # tokens the policy sampled (after the prompt)
    env_tokens: int = 0  # template and environment tokens between its turns
    tool_calls: int = 0
    tool_errors: collections.Counter[str] = field(default_factory=collections.Counter)  # by kind
    env_calls: int = 0  # `respond` calls
    env_s: float = 0.0  # seconds spent in them
    context_truncated: bool = False  # ended because the next turn would not fit seq_len
    reasoning_chars: int = 0  # characters of reasoning (`orchestrator/reasoning.py`) over its turns
    unfinished_reasoning: bool = False  # its last turn opened a reasoning block and never closed it

    def add_split(self, text: str, reasoning: ReasoningConfig | None) -> str:
        """Count `text`'s reasoning (under `reasoning`, None: no parser) and return what the environment sees:
        the answer, or all of `text` without a parser."""
        if reasoning is None or reasoning.parser == "none":
            return text
        split = split_reasoning(text, reasoning.start_tag, reasoning.end_tag, reasoning.opened_by_prompt)
        self.reasoning_chars += len(split.reasoning or "")
        self.unfinished_reasoning = split.unfinished
        return split.answer


@dataclass(frozen=True)
class RolloutSettings:
    """What every rollout of a run shares beyond its sampling rule."""

    max_tokens: int
    truncated_reward: float | None = None  # the reward of a truncated rollout (None: its score)
    vocab: int | None = None  # sampled ids past it fail their rollout (`cut_unsampleable`); None: unchecked
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat template variables, sent with chat requests
    reasoning: ReasoningConfig | None = None  # how a completion splits into reasoning and answer; None: no split


@dataclass
class Group:
    env: str  # the environment's metric name
    example: Example
    result: ChatResult
    rewards: list[float]
    components: list[dict[str, float]]
    errors: list[str | None] = field(default_factory=list)  # per rollout: why it failed (None: it did not)
    stats: list[TurnStats] = field(default_factory=list)  # per rollout


@dataclass
class Draw:
    env: str
    environment: Environment
    example: Example
    config: EnvConfig = field(default_factory=EnvConfig)  # score_timeout_s, on_error


class EnvironmentFailed(UserError):
    """An environment call raised or timed out, and its environment's on_error is "fail"."""


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


def report_failure(draw: Draw, why: str) -> str:
    """Log an environment failure of `draw` sparsely and return `why`; with on_error = "fail", raise it."""
    prompt = json.dumps(draw.example.prompt[-1]["content"] if draw.example.prompt else "")[:200]
    message = f"environment '{draw.env}': {why} (example prompt {prompt}, answer {json.dumps(draw.example.answer)[:100]})"
    if draw.config.on_error == "fail":
        raise EnvironmentFailed(message)
    _failures[draw.env] += 1
    count = _failures[draw.env]
    if count <= WARN_FIRST or math.log10(count).is_integer():  # the first few, then the 10th, 100th, ...
        log.warning(f"{message}: the rollout scores 0 (failure {count} of this environment; rollout/env_error_frac)")
    return why


async def call_env(draw: Draw, what: str, call: Any, timeout_key: str) -> tuple[Any, str | None]:
    """(await call, None), or (None, why) when it raised or took longer than the environment config's
    `timeout_key` seconds (reported with `report_failure`)."""
    timeout = getattr(draw.config, timeout_key)
    try:
        return await asyncio.wait_for(call, timeout), None
    except TimeoutError:
        why = f"{what} took longer than {timeout_key} = {timeout:g}s"
    except EnvironmentFailed:
        raise
    except Exception as exc:  # an environment's bug must not end the run unless asked to
        why = f"{what} raised {type(exc).__name__}: {str(exc)[:300]}"
    return None, report_failure(draw, why)


def not_rewards(values: object) -> str | None:
    """What makes `values` other than a list of `Reward`s with finite real totals (a NaN reward would make the
    group's advantages NaN), or None."""
    if not isinstance(values, list | tuple):
        return f"a {type(values).__name__}, not a list of Rewards"
    for value in values:
        if not isinstance(value, Reward):
            return f"a {type(value).__name__} where a Reward belongs"
        total = value.total
        if isinstance(total, bool) or not isinstance(total, int | float) or not math.isfinite(total):
            return f"a reward whose total is {total!r}, not a finite number"
    return None


async def score_rollouts(draw: Draw, rollouts: list[Rollout], failed: list[str | None]
                         ) -> tuple[list[Reward], list[str | None]]:
    """Rewards of a group's rollouts (0 for one that already failed) and why each failed (None: it did not)."""
    env = draw.environment
    if all(why is None for why in failed):
        group, why = await call_env(draw, "score_group", env.score_group(draw.example, rollouts), "score_timeout_s")
        if why is not None:
            return [Reward(0.0)] * len(rollouts), [why] * len(rollouts)
        if group is not None:
            problem = (f"{len(group)} rewards for {len(rollouts)} rollouts" if isinstance(group, list | tuple)
                       and len(group) != len(rollouts) else not_rewards(group))
            if problem:
                why = report_failure(draw, f"score_group returned {problem}")
                return [Reward(0.0)] * len(rollouts), [why] * len(rollouts)
            return list(group), list(failed)

    async def one(rollout: Rollout, why: str | None) -> tuple[Reward, str | None]:
        if why is not None:
            return Reward(0.0), why
        reward, why = await call_env(draw, "score", env.score_rollout(draw.example, rollout), "score_timeout_s")
        if why is None and (problem := not_rewards([reward])):
            why = report_failure(draw, f"score returned {problem}")
        return (reward, None) if why is None else (Reward(0.0), why)

    scored = await asyncio.gather(*(one(r, w) for r, w in zip(rollouts, failed, strict=True)))
    return [r for r, _ in scored], [w for _, w in scored]


async def score_group(draw: Draw, result: ChatResult, truncated_reward: float | None = None,
                      rollouts: list[Rollout] | None = None, stats: list[TurnStats] | None = None,
                      failed: list[str | None] | None = None, reasoning: ReasoningConfig | None = None) -> Group:
    """Score every rollout with the environment; a truncated one gets `truncated_reward` if set. Without
    `rollouts` (single-turn) each completion is a one-message conversation holding its answer (`reasoning`:
    the text after its reasoning block; None: all of it)."""
    completions = result.completions
    if rollouts is None:
        stats = [TurnStats(sampled_tokens=len(c.token_ids)) for c in completions]
        rollouts = [Rollout([{"role": "assistant", "content": s.add_split(c.text, reasoning)}], c.truncated)
                    for c, s in zip(completions, stats, strict=True)]
    rewards, errors = await score_rollouts(draw, rollouts, failed or [None] * len(rollouts))
    totals = [
        truncated_reward if truncated_reward is not None and c.truncated else r.total
        for c, r in zip(completions, rewards, strict=True)
    ]
    return Group(draw.env, draw.example, result, totals, [r.components for r in rewards], errors, list(stats))


def cut_unsampleable(draw: Draw, result: ChatResult, vocab: int | None, failed: list[str | None]) -> list[str | None]:
    """Cut every completion at its first token id >= `vocab` (the tokenizer's ids, `utils.vocabulary`: a padded
    row of the output embedding that a server sampled; vLLM does not mask them) and fail that rollout alone:
    reward 0 and a sparse warning, whatever the environment's `on_error` (the server, not the environment, made
    it), so no trainer ever scores an id outside the sampled vocabulary and no such sample ends a run."""
    if vocab is None:
        return failed
    failed = list(failed)
    for i, c in enumerate(result.completions):
        bad = next((k for k, t in enumerate(c.token_ids) if not 0 <= t < vocab), None)
        if bad is None:
            continue
        why = f"the server sampled token id {c.token_ids[bad]}, past the tokenizer's {vocab} ids"
        c.token_ids, c.logprobs, c.weight_steps = c.token_ids[:bad], c.logprobs[:bad], c.weight_steps[:bad]
        c.mask = None if c.mask is None else c.mask[:bad]
        _unsampleable[draw.env] += 1
        count = _unsampleable[draw.env]
        if count <= WARN_FIRST or math.log10(count).is_integer():
            log.warning(f"environment '{draw.env}': {why}: the rollout is cut there and scores 0 (rollout {count} "
                        "of this environment; rollout/env_error_frac)")
        failed[i] = failed[i] or why
    return failed


async def generate_groups(client: InferenceClient, draws: list[Draw], n: int, rule: SamplingRule,
                          settings: RolloutSettings, seeds: list[int | None],
                          conversations: ConversationRunner | None = None) -> list[Group]:
    """Ask for `n` rollouts of every draw (bounded by the client's concurrency) and score them. A multi-turn
    environment's draws run through `conversations` (token in, token out); the others are one chat request.
    A completion holding an id past `settings.vocab` is cut there and fails alone (`cut_unsampleable`)."""

    async def one(draw: Draw, seed: int | None) -> Group:
        if draw.environment.multi_turn:
            if conversations is None:
                raise UserError(f"environment '{draw.env}' is multi-turn, but no conversation runner was set up")
            result, rollouts, stats, failed = await conversations.run_group(
                client, draw, n, rule, settings.max_tokens, seed)
            failed = cut_unsampleable(draw, result, settings.vocab, failed)
            return await score_group(draw, result, settings.truncated_reward, rollouts, stats, failed)
        result = await client.chat(draw.example.prompt, n, rule, settings.max_tokens, seed,
                                   template_kwargs=settings.template_kwargs)
        failed = cut_unsampleable(draw, result, settings.vocab, [None] * len(result.completions))
        return await score_group(draw, result, settings.truncated_reward, failed=failed, reasoning=settings.reasoning)

    return list(await asyncio.gather(*(one(d, s) for d, s in zip(draws, seeds, strict=True))))

"""Scoring a draw's rollouts with its environment, the same for every rollout kind: `score_group` (a truncated
rollout may get `truncated_reward`; an environment call that raises or outlasts its timeout fails the rollout, a
whole group for `score_group`, as `env_calls.py` says), and `cut_unsampleable` (an id the tokenizer does not have
fails its rollout alone)."""

from __future__ import annotations

import asyncio
import collections
import math

from prime_rl.envs import Reward
from prime_rl.envs.environment import Rollout
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.env_calls import call_env, report_failure, worth_logging
from prime_rl.orchestrator.rollouts.scored_group import Group, TurnStats
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")
_unsampleable: collections.Counter[str] = collections.Counter()  # rollouts cut by `cut_unsampleable`


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
    return Group(draw.env, draw.example, result, totals, [r.components for r in rewards], errors, list(stats),
                 rollouts=list(rollouts), exclude_failed=draw.config.on_error == "exclude")


def cut_unsampleable(draw: Draw, rollouts: list[list[RolloutCompletion]], vocab: int | None,
                     failed: list[str | None]) -> list[str | None]:
    """Cut every completion of each rollout (its samples) at its first token id >= `vocab` (the tokenizer's ids,
    `models.vocabulary`: a padded row of the output embedding that a server sampled; vLLM does not mask them)
    and fail that rollout alone: reward 0 and a sparse warning, whatever the environment's `on_error` (the
    server, not the environment, made it), so no trainer ever scores an id outside the sampled vocabulary and no
    such sample ends a run."""
    if vocab is None:
        return failed
    failed = list(failed)
    for i, c in ((i, c) for i, completions in enumerate(rollouts) for c in completions):
        bad = next((k for k, t in enumerate(c.token_ids) if not 0 <= t < vocab), None)
        if bad is None:
            continue
        why = f"the server sampled token id {c.token_ids[bad]}, past the tokenizer's {vocab} ids"
        c.cut(bad)
        _unsampleable[draw.env] += 1
        count = _unsampleable[draw.env]
        if worth_logging(count):
            outcome = "is left out of training" if draw.config.on_error == "exclude" else "scores 0"
            log.warning(f"environment '{draw.env}': {why}: the rollout is cut there and {outcome} (rollout {count} "
                        "of this environment; rollout/env_error_frac)")
        failed[i] = failed[i] or why
    return failed

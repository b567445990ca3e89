"""Turning draws into scored groups.

A *group* is one example with its `n` rollouts, each scored by the example's environment
(`score_rollout`, or `score_group` for all `n` at once). A single-turn rollout is one chat
completion; a multi-turn one is a conversation run token-in, token-out
(`orchestrator/conversation.py`); an agent's is what its session recorded, one sample per segment
(`orchestrator/agent_rollouts.py`). The draws come from `orchestrator/draws.py`; an environment
call that raises or outlasts its timeout fails the rollout (a whole group, for `score_group`)
as `orchestrator/env_calls.py` says. `GroupGenerator` is the one way a draw becomes a group: it
holds what every request of a run shares (the client, `n`, the sampling rule, the
`RolloutSettings`, the multi-turn and agent runners); the rollout collectors (`orchestrator/collector.py`)
and the evaluation use it.
"""

from __future__ import annotations

import asyncio
import collections
import math
from dataclasses import dataclass, field, replace
from typing import Any

from prime_rl.envs import Example, Reward
from prime_rl.envs.agent import AgentEnvironment
from prime_rl.envs.environment import Rollout
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.agent_rollouts import AgentRunner, TrainedPiece
from prime_rl.orchestrator.client import ChatResult, InferenceClient, RolloutCompletion
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.conversation import ConversationRunner, TurnStats
from prime_rl.orchestrator.draws import Draw
from prime_rl.orchestrator.env_calls import call_env, report_failure, worth_logging
from prime_rl.orchestrator.servers import ServerPool
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")
_unsampleable: collections.Counter[str] = collections.Counter()  # rollouts cut by `cut_unsampleable`


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
    pieces: list[list[TrainedPiece]] | None = None  # per agent rollout: its segments (None: one sample each)
    rollouts: list[Rollout] = field(default_factory=list)  # per rollout: the conversation the environment scored
    exclude_failed: bool = False  # its environment's on_error = "exclude": a failed rollout trains nothing

    def trained(self, index: int) -> list[TrainedPiece]:
        """Rollout `index` as the samples it trains, (prompt ids, completion) each: the group's prompt and its
        completion, or an agent rollout's segments (none when its agent never called the model)."""
        if self.pieces is None:
            return [TrainedPiece(self.result.prompt_token_ids, self.result.completions[index])]
        return self.pieces[index]

    def all_trained(self) -> list[TrainedPiece]:
        """Every sample of the group, rollout after rollout."""
        return [piece for index in range(len(self.rewards)) for piece in self.trained(index)]

    def trains(self, index: int) -> bool:
        """Whether rollout `index` is trained: not a failed one when failures are excluded."""
        return not (self.exclude_failed and index < len(self.errors) and self.errors[index] is not None)

    def policy_step(self, index: int) -> int:
        """The oldest weight step of rollout `index`'s tokens (the admission step when it has none)."""
        return min((self.result.policy_step(p.completion) for p in self.trained(index)),
                   default=self.result.weight_step)


def request_seed(seed: int, step: int, index: int) -> int:
    """A per-request sampling seed, so a (resumed) run's rollouts repeat given the same weights."""
    return ((seed * 1_000_003 + step) * 100_003 + index * 1_009) % (2**31 - 1)


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
        c.token_ids, c.logprobs, c.weight_steps = c.token_ids[:bad], c.logprobs[:bad], c.weight_steps[:bad]
        c.mask = None if c.mask is None else c.mask[:bad]
        _unsampleable[draw.env] += 1
        count = _unsampleable[draw.env]
        if worth_logging(count):
            outcome = "is left out of training" if draw.config.on_error == "exclude" else "scores 0"
            log.warning(f"environment '{draw.env}': {why}: the rollout is cut there and {outcome} (rollout {count} "
                        "of this environment; rollout/env_error_frac)")
        failed[i] = failed[i] or why
    return failed


@dataclass(frozen=True)
class GroupGenerator:
    """Draws to scored groups against the inference server(s): `n` rollouts of each draw under `rule` and
    `settings`, a multi-turn environment's through `conversations` (token in, token out; None: no environment
    of the run is multi-turn), an agent environment's through `agents` (None: no agent environment), the others
    as one chat request each (at most the client's `max_concurrency` in flight). A completion holding an id past
    `settings.vocab` is cut there and fails alone (`cut_unsampleable`)."""

    client: InferenceClient | ServerPool
    n: int
    rule: SamplingRule
    settings: RolloutSettings
    conversations: ConversationRunner | None = None
    agents: AgentRunner | None = None

    async def generate(self, draws: list[Draw], seeds: list[int | None]) -> list[Group]:
        """One scored group per draw, in the draws' order; `seeds[i]` seeds draw i's request."""
        return list(await asyncio.gather(*(self._group(d, s) for d, s in zip(draws, seeds, strict=True))))

    async def _group(self, draw: Draw, seed: int | None) -> Group:
        settings = self.settings
        if isinstance(draw.environment, AgentEnvironment):
            if self.agents is None:
                raise UserError(f"environment '{draw.env}' runs an agent, but no agent runner was set up")
            out = await self.agents.run_group(draw, self.n, self.rule, settings.max_tokens, seed)
            failed = cut_unsampleable(draw, [[p.completion for p in rollout] for rollout in out.pieces],
                                      settings.vocab, out.failed)
            group = await score_group(draw, out.result, settings.truncated_reward, out.rollouts, out.stats, failed)
            return replace(group, pieces=out.pieces)
        if draw.environment.multi_turn:
            if self.conversations is None:
                raise UserError(f"environment '{draw.env}' is multi-turn, but no conversation runner was set up")
            result, rollouts, stats, failed = await self.conversations.run_group(
                self.client, draw, self.n, self.rule, settings.max_tokens, seed)
            failed = cut_unsampleable(draw, [[c] for c in result.completions], settings.vocab, failed)
            return await score_group(draw, result, settings.truncated_reward, rollouts, stats, failed)
        result = await self.client.chat(draw.example.prompt, self.n, self.rule, settings.max_tokens, seed,
                                        template_kwargs=settings.template_kwargs)
        failed = cut_unsampleable(draw, [[c] for c in result.completions], settings.vocab,
                                  [None] * len(result.completions))
        return await score_group(draw, result, settings.truncated_reward, failed=failed, reasoning=settings.reasoning)

"""A draw's scored rollouts, the shape every rollout kind returns: `Group` (the completions, their rewards, how each
went as `TurnStats`, and what each trains as `TrainedPiece`s)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import NamedTuple

from prime_rl.chat.reasoning import split_reasoning
from prime_rl.envs.environment import Example, Rollout
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import ReasoningConfig


@dataclass
class TurnStats:
    """How one rollout's conversation went (all 1/0 for a single-turn rollout, which is a one-turn conversation)."""

    turns: int = 1  # policy turns
    sampled_tokens: int = 0  # tokens the policy sampled (after the prompt)
    env_tokens: int = 0  # template and environment tokens between its turns
    tool_calls: int = 0
    tool_errors: collections.Counter[str] = field(default_factory=collections.Counter)  # by kind
    env_calls: int = 0  # `respond` calls
    env_s: float = 0.0  # seconds spent in them
    context_truncated: bool = False  # ended because the next turn would not fit seq_len
    reasoning_chars: int = 0  # characters of reasoning (`chat/reasoning.py`) over its turns
    unfinished_reasoning: bool = False  # its last turn opened a reasoning block and never closed it
    segments: int = 1  # training samples (an agent session that forked has several: `agents/stitching.py`)
    forks: collections.Counter[str] = field(default_factory=collections.Counter)  # an agent session's, by reason

    def add_split(self, text: str, reasoning: ReasoningConfig | None) -> str:
        """Count `text`'s reasoning (under `reasoning`, None: no parser) and return what the environment sees:
        the answer, or all of `text` without a parser."""
        if reasoning is None or reasoning.parser == "none":
            return text
        split = split_reasoning(text, reasoning.start_tag, reasoning.end_tag, reasoning.opened_by_prompt)
        self.reasoning_chars += len(split.reasoning or "")
        self.unfinished_reasoning = split.unfinished
        return split.answer


class TrainedPiece(NamedTuple):
    """One sample of a rollout: its prompt ids, what follows them, and (with a turn discount) each token's share
    of the rollout's advantage (None: all of it)."""

    prompt_ids: list[int]
    completion: RolloutCompletion
    scales: list[float] | None = None


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

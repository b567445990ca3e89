"""The seam between the orchestrator and its kinds of rollout: what a runner is given and what it answers.

Every environment says its rollout kind (`Environment.rollout_kind`: "single_turn", "multi_turn", "agent", or a
kind of your own); the run holds one `RolloutRunner` per kind its environments use (`kinds.py` builds them), and
every draw goes to its environment's runner, which returns the draw's scored `Group` (`scored_group.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.config import OrchestratorConfig, ReasoningConfig

if TYPE_CHECKING:
    from prime_rl.chat.template_tokens import ChatTokens
    from prime_rl.orchestrator.client import InferenceClient
    from prime_rl.orchestrator.examples.draws import Draw
    from prime_rl.orchestrator.rollouts.scored_group import Group
    from prime_rl.orchestrator.servers import ServerPool


@dataclass(frozen=True)
class RolloutSettings:
    """What every rollout of a run shares beyond its sampling rule."""

    max_tokens: int
    truncated_reward: float | None = None  # the reward of a truncated rollout (None: its score)
    vocab: int | None = None  # sampled ids past it fail their rollout (`cut_unsampleable`); None: unchecked
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat template variables, sent with chat requests
    reasoning: ReasoningConfig | None = None  # how a completion splits into reasoning and answer; None: no split


class RolloutRunner(Protocol):
    """Runs the rollouts of one kind: `n` rollouts of `draw` under `rule` and `settings`, scored, as one `Group`;
    `seed` seeds its requests (rollout i: seed + i; None: unseeded). `stop` releases what it holds (a server)."""

    async def run_group(self, draw: Draw, n: int, rule: SamplingRule, settings: RolloutSettings,
                        seed: int | None) -> Group: ...

    async def stop(self) -> None: ...


@dataclass
class RunnerContext:
    """What a runner is built from: the orchestrator's config and its client (one server or a pool), and the served
    model's chat template as token ids, loaded the first time a runner asks for it."""

    config: OrchestratorConfig
    client: InferenceClient | ServerPool

    @cached_property
    def chat_tokens(self) -> ChatTokens:
        from prime_rl.chat.template_tokens import ChatTokens

        model = self.config.model
        return ChatTokens.load(model.path, model.trust_remote_code, self.config.chat_template_kwargs)

    def vocab(self) -> int | None:
        """The tokenizer's id count (`models.vocabulary`): from the loaded tokenizer when a runner loaded it, else
        read from the model's files."""
        from prime_rl.models.vocabulary import local_tokenizer_vocab, tokenizer_vocab

        if "chat_tokens" in self.__dict__:  # loaded by a runner: no second read
            return tokenizer_vocab(self.chat_tokens.tokenizer)
        return local_tokenizer_vocab(self.config.model.path, self.config.model.trust_remote_code)

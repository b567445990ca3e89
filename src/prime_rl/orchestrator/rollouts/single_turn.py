"""Single-turn rollouts: one chat request of `n` choices per draw (at most the client's `max_concurrency` in
flight); each completion is a one-message conversation holding its answer (`reasoning`: the text after its
reasoning block) for the environment to score."""

from __future__ import annotations

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.client import InferenceClient
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.orchestrator.rollouts.scoring import cut_unsampleable, score_group
from prime_rl.orchestrator.rollouts.seam import RolloutSettings, RunnerContext
from prime_rl.orchestrator.servers import ServerPool


class SingleTurnRunner:
    """The runner of kind "single_turn" (module docstring)."""

    def __init__(self, client: InferenceClient | ServerPool):
        self.client = client

    @classmethod
    def build(cls, context: RunnerContext) -> SingleTurnRunner:
        return cls(context.client)

    async def run_group(self, draw: Draw, n: int, rule: SamplingRule, settings: RolloutSettings,
                        seed: int | None) -> Group:
        result = await self.client.chat(draw.example.prompt, n, rule, settings.max_tokens, seed,
                                        template_kwargs=settings.template_kwargs)
        failed = cut_unsampleable(draw, [[c] for c in result.completions], settings.vocab,
                                  [None] * len(result.completions))
        return await score_group(draw, result, settings.truncated_reward, failed=failed, reasoning=settings.reasoning)

    async def stop(self) -> None:
        pass

"""A rollout kind of a user's own, in one module and one registration line (docs/architecture.md, "Adding a
rollout kind"): kind "hinted" asks the policy with a hint after the example's prompt, then scores its answers as a
single-turn rollout's. An environment says the kind; `id = "tests.support.hinted_kind:HintedReverseText"` in
`[[orchestrator.env]]` imports this module, which registers the runner."""

from __future__ import annotations

from prime_rl.envs.reverse_text import ReverseTextEnv
from prime_rl.orchestrator.rollouts.kinds import register_rollout_kind
from prime_rl.orchestrator.rollouts.scoring import cut_unsampleable, score_group

HINT = {"role": "user", "content": "(backwards)"}
GROUPS: list[int] = []  # the size of every group the runner made, in this process


class HintedRunner:
    def __init__(self, client):
        self.client = client

    @classmethod
    def build(cls, context):
        return cls(context.client)

    async def run_group(self, draw, n, rule, settings, seed):
        prompt = [*draw.example.prompt, HINT]
        result = await self.client.chat(prompt, n, rule, settings.max_tokens, seed,
                                        template_kwargs=settings.template_kwargs)
        GROUPS.append(len(result.completions))
        failed = cut_unsampleable(draw, [[c] for c in result.completions], settings.vocab, [None] * n)
        return await score_group(draw, result, settings.truncated_reward, failed=failed, reasoning=settings.reasoning)

    async def stop(self):
        pass


class HintedReverseText(ReverseTextEnv):
    id = "hinted-reverse-text"
    rollout_kind = "hinted"


register_rollout_kind("hinted", HintedRunner.build)

"""A scripted fake inference client and one orchestrator step against it (orchestrator tests)."""

from __future__ import annotations

import asyncio

from prime_rl.batch_format import read_rank
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.orchestrator_ckpt import OrchestratorState


class ScriptedClient:
    """Odd-numbered requests get mixed completions (half right), even ones all wrong (zero advantage).

    Completion j of a request is truncated ('length') when j == n - 1 and `truncate_last` is set.
    """

    def __init__(self, truncate_last: bool = False):
        self.calls = 0
        self.truncate_last = truncate_last

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        self.calls += 1
        answer = messages[-1]["content"][::-1]
        mixed = self.calls % 2 == 1
        completions = []
        for j in range(n):
            text = answer if mixed and j % 2 == 0 else "#"
            reason = "length" if self.truncate_last and j == n - 1 else "stop"
            ids = [ord(c) % 90 for c in text] + [2]  # ids the char tokenizer has (the orchestrator checks)
            completions.append(RolloutCompletion(ids, [-0.5] * len(ids), text, reason))
        return ChatResult([1] * 5, 0, completions)

    async def update_weights(self, path, step):  # no weights directory exists in these tests
        raise AssertionError("unexpected weight update")


def run_step(tmp_path, client, **overrides):
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 8, "rollouts_per_example": 4, "seq_len": 64,
        "wandb": {"mode": "disabled"}, **overrides,
    })
    orch = Orchestrator(config, client, OrchestratorState())
    metrics = asyncio.run(orch.step(0))
    batch = read_rank(tmp_path, 0, 0)
    return metrics, batch

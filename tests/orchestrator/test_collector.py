"""The rollout collectors (`orchestrator/collector.py`) work from their collaborators alone: built without an
`Orchestrator`, each fills a step's batch, reports the generation metrics the loop logs, and draws its examples
from the `ExampleSource` it was handed (the one the orchestrator checkpoints)."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.orchestrator.collector import Collaborators
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.examples.draws import ExampleSource
from prime_rl.orchestrator.group_advantages import GroupAdvantages
from prime_rl.orchestrator.orchestrator import COLLECTORS
from prime_rl.orchestrator.rollouts.generator import GroupGenerator
from prime_rl.orchestrator.rollouts.seam import RolloutSettings
from prime_rl.orchestrator.rollouts.single_turn import SingleTurnRunner
from prime_rl.orchestrator.weight_sync import WeightSync
from tests.support.scripted_client import ScriptedClient


@pytest.mark.parametrize("mode", ["step", "continuous"])
@pytest.mark.parametrize("filtering", [False, True])
def test_a_collector_fills_a_step_from_its_collaborators_alone(tmp_path, mode, filtering):
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "batch_size": 8, "rollouts_per_example": 4, "seq_len": 64, "rollout_mode": mode,
        "client": {"max_concurrency": 2}, "filter_zero_advantage": filtering, "wandb": {"mode": "disabled"},
        "dynamic_sampling": filtering and mode == "step",  # refill the batch (continuous mode does by itself)
    })
    client = ScriptedClient()  # every other request's group ties: zero advantage
    source = ExampleSource(config.env, config.seed)
    generator = GroupGenerator({"single_turn": SingleTurnRunner(client)}, 4, config.sampling.rule,
                               RolloutSettings(config.sampling.max_tokens))
    parts = Collaborators(generator,
                          source, WeightSync(client, tmp_path, config.max_async_level, 5.0),
                          GroupAdvantages(config.advantage, 4))
    collector = COLLECTORS[mode](parts, config)

    async def first_step():
        try:
            await collector.prepare(0, evaluating=False)
            return await collector.collect(0)
        finally:
            await collector.stop()

    collected = asyncio.run(first_step())
    assert len(collected.kept) == 2 and all(g in collected.groups for g in collected.kept)
    assert len(collected.groups) == (3 if filtering else 2)  # request 2's group ties: dropped, one more taken
    assert {"perf/wait_for_weights_s", "perf/inference_tokens_per_s", "async/inference_idle_frac"} <= set(
        collected.metrics)
    drawn = sum(source.cursors.values())
    if mode == "step":
        assert drawn == client.calls == len(collected.groups)
    else:  # more may have been in flight when the batch was full
        assert drawn >= len(collected.groups)

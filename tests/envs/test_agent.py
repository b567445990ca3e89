"""The `agent` environment's own rules (`envs/agent.py`): what counts as an agent's reward, the example a command
reads, and the task it delegates examples and scoring to. Running agents:
tests/orchestrator/rollouts/agents/test_runner.py."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from prime_rl.envs.agent import AGENT_REWARD, AgentEnvironment, agent_reward, example_json
from prime_rl.envs.environment import Example, Reward, Rollout

HERE = "tests.envs.test_agent"


async def run(client, example):
    return None


@pytest.mark.parametrize("value, reward", [
    (None, None),
    (1, Reward(1.0)),
    (-0.5, Reward(-0.5)),
    (Reward(0.25, {"a": 1.0}), Reward(0.25, {"a": 1.0})),
    (Reward(1, {"a": True * 0 + 1}), Reward(1.0, {"a": 1.0})),
    ({"reward": 0.75}, Reward(0.75)),
    ({"reward": 1, "components": {"exact": 1, "format": 0.5}}, Reward(1.0, {"exact": 1.0, "format": 0.5})),
    ({"reward": None}, None),
])
def test_an_agent_may_return_a_number_a_reward_an_object_or_nothing(value, reward):
    assert agent_reward(value) == reward


@pytest.mark.parametrize("value, message", [
    (True, "finite number"),
    (math.nan, "finite number"),
    (math.inf, "finite number"),
    ("1.0", "finite number"),
    ([1.0], "finite number"),
    ({"score": 1.0}, "needs 'reward'"),
    ({"reward": 1.0, "extra": 2}, "needs 'reward'"),
    ({"reward": 1.0, "components": {"a": "high"}}, "finite number"),
    ({"reward": 1.0, "components": [1.0]}, "must be an object of numbers"),
    (Reward(1.0, {"a": "x"}), "finite number"),
    (Reward(math.nan), "finite number"),
    (10**400, "finite number"),
])
def test_anything_else_an_agent_returns_is_named(value, message):
    with pytest.raises(ValueError, match=message):
        agent_reward(value)


def test_a_command_reads_the_example_as_json_whatever_its_info_holds():
    example = Example([{"role": "user", "content": "2*3"}], "6", {"a": 2, "when": object(), "tags": ("x",)})
    read = json.loads(example_json(example))
    assert read["prompt"] == example.prompt and read["answer"] == "6" and read["info"]["a"] == 2
    assert read["info"]["tags"] == ["x"] and read["info"]["when"].startswith("<object")


def test_the_task_gives_the_examples_and_scores_unless_the_agent_did():
    env = AgentEnvironment(task={"id": "calculator", "args": {"min_operand": 10, "max_operand": 20}},
                           function=f"{HERE}:run")
    example = next(env.examples(seed=3))
    assert example == next(env.task.examples(seed=3))
    assert env.demonstration(example) == env.task.demonstration(example)
    answered = Rollout([{"role": "assistant", "content": example.answer}])
    mine = Rollout([{"role": "assistant", "content": "wrong"}], state={AGENT_REWARD: Reward(0.5)})

    async def score():
        return (await env.score_rollout(example, answered), await env.score_rollout(example, mine),
                await env.score_group(example, [answered, mine]))

    by_task, by_agent, group = asyncio.run(score())
    assert by_task.total == 1.0 and by_task.components["exact_match"] == 1.0
    assert by_agent == Reward(0.5) and group is None  # an agent's reward: each rollout alone

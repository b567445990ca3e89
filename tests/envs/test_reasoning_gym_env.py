"""The reasoning-gym adapter: tasks score their own reference answers 1.0 and wrong ones below 1 (through the
answer extraction), mixes draw by weight with per-task reward components, train and eval streams differ,
resume is exact, and an unknown task is one line with close names."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from prime_rl.envs import load_env
from prime_rl.utils.errors import UserError

pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")

TASKS = ["leg_counting", "basic_arithmetic", "base_conversion"]


@pytest.mark.parametrize("task", TASKS)
def test_each_task_scores_its_reference_answer_one_and_a_wrong_answer_below(task):
    env = load_env("reasoning-gym", tasks=task, size=20)
    for example in itertools.islice(env.examples(seed=1), 3):
        right = asyncio.run(env.score(example, f"Let me think.\n<answer>{example.answer}</answer>"))
        wrong = asyncio.run(env.score(example, "<answer>definitely not it</answer>"))
        assert right.total == 1.0 and right.components == {task: 1.0}
        assert wrong.total < 1.0


def test_a_mix_draws_tasks_by_weight_and_streams_are_deterministic_and_disjoint():
    env = load_env("reasoning-gym", tasks={"leg_counting": 1.0, "basic_arithmetic": 3.0}, size=50)
    drawn = [e.info["task"] for e in itertools.islice(env.examples(seed=2), 400)]
    assert 0.65 < drawn.count("basic_arithmetic") / 400 < 0.85
    first = [e.prompt[-1]["content"] for e in itertools.islice(env.examples(seed=2), 60)]
    again = [e.prompt[-1]["content"] for e in itertools.islice(env.examples(seed=2), 60)]
    held_out = [e.prompt[-1]["content"] for e in itertools.islice(env.eval_examples(seed=2), 60)]
    assert first == again and first != held_out
    tail = [e.prompt[-1]["content"] for e in itertools.islice(env.examples(seed=2), 45, 60)]  # a resume's skip
    assert tail == first[45:]


def test_an_unknown_task_lists_close_names_and_a_bad_config_is_one_line():
    with pytest.raises(UserError, match="unknown task 'leg_count' .*close names: leg_counting"):
        load_env("reasoning-gym", tasks="leg_count")
    with pytest.raises(UserError, match="task 'leg_counting' rejects its config"):
        load_env("reasoning-gym", tasks="leg_counting", task_config={"leg_counting": {"no_such_option": 3}})
    with pytest.raises(UserError, match="task_config names task"):
        load_env("reasoning-gym", tasks="leg_counting", task_config={"basic_arithmetic": {}})


def test_a_pass_score_makes_the_reward_all_or_nothing_and_keeps_the_tasks_score():
    env = load_env("reasoning-gym", tasks="spell_backward", size=20, pass_score=1.0)
    example = next(env.examples(seed=1))
    right = asyncio.run(env.score(example, f"<answer>{example.answer}</answer>"))
    near = asyncio.run(env.score(example, f"<answer>{example.answer[:-1]}x</answer>"))  # partial credit per letter
    assert right.total == 1.0 and right.components == {"spell_backward": 1.0, "spell_backward/score": 1.0}
    assert near.total == 0.0 and 0 < near.components["spell_backward/score"] < 1
    for bad in (0, 1.5, True, "1"):
        with pytest.raises(UserError, match="pass_score must be a number in"):
            load_env("reasoning-gym", tasks="spell_backward", pass_score=bad)

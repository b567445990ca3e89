"""Reward functions by name: each built-in on hand cases, answer extraction and normalisation, custom functions
(sync, async, with the row's columns), and custom functions that raise or return NaN fail the rollout alone."""

from __future__ import annotations

import asyncio
import collections
import json
import math

import pytest

from prime_rl.envs import load_env
from prime_rl.envs.reward_functions import builtin_rewards, extract_answer, parse_number
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.rollouts import env_calls
from prime_rl.orchestrator.rollouts.env_calls import EnvironmentFailed
from prime_rl.orchestrator.rollouts.scoring import score_group

FN = builtin_rewards("auto", ("strip", "whitespace"))


@pytest.mark.parametrize(("text", "how", "expected"), [
    ("so <answer> 42 </answer>", "auto", " 42 "),
    ("<answer>1</answer> then <answer>2</answer>", "answer_tags", "2"),
    ("the answer is \\boxed{\\frac{1}{2}}.", "auto", "\\frac{1}{2}"),
    ("\\boxed{a} and \\boxed{b}", "boxed", "b"),
    ("\\boxed{unclosed", "boxed", ""),
    ("work\n\n  7  \n", "last_line", "  7  "),
    ("The difference of 4 and 6 is -2.", "last_number", "-2"),
    ("4 - 6 = 2, no: 1,024 apples", "last_number", "1024"),
    ("half is 1/2 or .5", "last_number", ".5"),
    ("no number at all", "last_number", ""),
    ("plain", "auto", "plain"),
    ("plain", "answer_tags", ""),
])
def test_answers_are_extracted_as_configured(text, how, expected):
    assert extract_answer(text, how) == expected


@pytest.mark.parametrize(("fn", "completion", "answer", "expected"), [
    ("exact_match", "<answer>  Paris </answer>", "Paris", 1.0),
    ("exact_match", "paris", "Paris", 0.0),
    ("numeric_match", "so 1,000 apples", "1000", 1.0),
    ("numeric_match", "\\boxed{3/4}", "0.75", 1.0),
    ("numeric_match", "about 0.7501", "0.75", 0.0),
    ("numeric_match", "0.75000001", "0.75", 1.0),  # within 1e-6 relative
    ("numeric_match", "no number", "3", 0.0),
    ("format_answer_tags", "<answer>x</answer>", "y", 1.0),
    ("format_answer_tags", "<answer>x", "y", 0.0),
    ("format_boxed", "\\boxed{}", "y", 1.0),
    ("math_verify", "\\boxed{1/2}", "0.5", 1.0),
    ("math_verify", "\\boxed{\\frac12}", "1/2", 1.0),
    ("math_verify", "$\\frac{1}{2}$", "\\boxed{0.5}", 1.0),
    ("math_verify", "\\boxed{1/3}", "0.5", 0.0),
])
def test_built_in_rewards_on_hand_cases(fn, completion, answer, expected):
    assert FN[fn](completion, answer) == expected


def test_normalisation_options():
    loose = builtin_rewards("none", ("strip", "whitespace", "lower", "punctuation"))["exact_match"]
    assert loose("  The   Eiffel tower!", "the eiffel tower") == 1.0
    assert parse_number("1/0") is None and parse_number("-2.5 or 3") == 3.0


def constant_half(completion, answer, **row):
    return 0.5


async def async_level(completion, answer, level, **row):
    return float(level) / 10


def raising(completion, answer, **row):
    raise KeyError("no such column")


def nan(completion, answer, **row):
    return math.nan


def environment(tmp_path, rewards, **args):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "a", "level": 3}) + "\n")
    return load_env("dataset", path=str(path), rewards=rewards, **args)


def test_custom_functions_get_the_row_and_may_be_async(tmp_path):
    env = environment(tmp_path, {f"{__name__}:constant_half": 2.0, f"{__name__}:async_level": 1.0})
    reward = asyncio.run(env.score(next(env.examples()), "whatever"))
    assert reward.components == {f"{__name__}:constant_half": 0.5, f"{__name__}:async_level": 0.3}
    assert reward.total == pytest.approx(1.3)


@pytest.mark.parametrize(("fn", "why"), [("raising", "score raised KeyError"),
                                         ("nan", "reward 'tests.envs.test_reward_functions:nan' returned nan")])
def test_a_raising_or_nan_reward_function_fails_the_rollout_alone_or_stops_with_on_error_fail(tmp_path, monkeypatch,
                                                                                             fn, why):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())
    env = environment(tmp_path, {f"{__name__}:{fn}": 1.0, "exact_match": 1.0})
    example = next(env.examples())
    result = ChatResult([1], 0, [RolloutCompletion([5], [-0.1], "a", "stop", [0])])
    group = asyncio.run(score_group(Draw("dataset", env, example, EnvConfig()), result))
    assert group.rewards == [0.0] and why in group.errors[0]
    with pytest.raises(EnvironmentFailed, match=why.split(" returned")[0]):
        asyncio.run(score_group(Draw("dataset", env, example, EnvConfig(on_error="fail")), result))


def test_unknown_or_unimportable_rewards_and_bad_weights_are_one_line(tmp_path):
    for rewards, message in [({"nope": 1.0}, "unknown reward 'nope'"),
                             ({"no_such_pkg.mod:fn": 1.0}, "cannot import module 'no_such_pkg.mod'"),
                             ({"exact_match": "high"}, "must be a number"), ({}, "rewards is empty")]:
        with pytest.raises(Exception, match=message) as info:
            environment(tmp_path, rewards)
        assert "\n" not in str(info.value)

"""Built-in environments: determinism, prompts/answers, reward functions, registry errors."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools

import pytest

from prime_rl.envs import ENVIRONMENTS, Environment, Example, Reward, load_env
from prime_rl.envs.rewards import lcs_length, lcs_ratio
from prime_rl.utils.errors import UserError


def score(env: Environment, example: Example, text: str) -> Reward:
    return asyncio.run(env.score(example, text))


def test_lcs_against_hand_computed_values():
    assert lcs_length("abcde", "ace") == 3
    assert lcs_length("abc", "") == 0
    assert lcs_ratio("abcd", "abcd") == 1.0
    assert lcs_ratio("abcd", "dcba") == pytest.approx(2 * 1 / 8)
    assert lcs_ratio("abcd", "abxd") == pytest.approx(2 * 3 / 8)
    assert lcs_ratio("abcd", "abcdzzzz") == pytest.approx(2 * 4 / 12)  # extra characters cost
    assert lcs_ratio("", "") == 1.0


def required_args(env_id: str, tmp_path) -> dict:
    """The arguments a built-in cannot do without: a data file, a reasoning-gym task."""
    if env_id == "dataset":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(f'{{"prompt": "p{i}", "answer": "a{i}"}}\n' for i in range(40)))
        return {"path": str(path)}
    if env_id == "reasoning-gym":
        pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")
        return {"tasks": "leg_counting", "size": 50}
    if env_id == "agent":  # its examples and scoring are its task's
        return {"task": {"id": "reverse-text"}, "function": "tests.envs.test_agent:run"}
    return {}


@pytest.mark.parametrize("env_id", sorted(ENVIRONMENTS))
def test_examples_are_deterministic_and_answers_score_one(env_id, tmp_path):
    env = load_env(env_id, **required_args(env_id, tmp_path))
    assert env.id == env_id
    first = list(itertools.islice(env.examples(seed=3), 20))
    assert first == list(itertools.islice(env.examples(seed=3), 20))
    assert first != list(itertools.islice(env.examples(seed=4), 20))
    for example in first:
        assert example.prompt[-1]["role"] == "user" and all({"role", "content"} <= set(m) for m in example.prompt)
        reward = score(env, example, example.answer)
        assert reward.total == 1.0 and all(0.0 <= v <= 1.0 for v in reward.components.values())
        assert 0.0 <= score(env, example, "").total < 1.0


def test_reverse_text_prompt_answer_and_partial_credit():
    env = load_env("reverse-text", min_len=5, max_len=12)
    for example in itertools.islice(env.examples(seed=0), 50):
        text = example.prompt[-1]["content"]
        assert 5 <= len(text) <= 12 and text.isalpha() and text.islower()
        assert example.answer == text[::-1]
        assert [m["role"] for m in example.prompt] == ["user"]  # no system message unless asked for
    instructed = next(load_env("reverse-text", system_prompt="Reverse the text.").examples(seed=0))
    assert instructed.prompt[0] == {"role": "system", "content": "Reverse the text."}
    example = Example(prompt=[], answer="olleh")
    assert score(env, example, " olleh\n").total == 1.0  # surrounding whitespace is ignored
    assert score(env, example, "hello").total == pytest.approx(2 * 2 / 10)  # LCS("olleh", "hello") = "ll"
    assert score(env, example, "olleX").components["lcs_ratio"] == pytest.approx(2 * 4 / 10)


def test_alphabet_sort_partial_credit():
    env = load_env("alphabet-sort", min_words=4, max_words=4)
    example = next(env.examples(seed=1))
    words = example.prompt[-1]["content"].split()
    assert len(words) == 4 and example.answer == " ".join(sorted(words))
    right = sorted(words)
    swapped = " ".join([right[1], right[0], *right[2:]])
    reward = score(env, example, swapped)
    assert reward.total == pytest.approx(2 * 3 / 8) and reward.components["exact"] == 0.0
    assert score(env, example, " ".join(right[:2])).total == pytest.approx(2 * 2 / 6)  # missing words cost


def test_arithmetic_exact_match():
    env = load_env("arithmetic", max_operand=9, operators="*")
    example = next(env.examples(seed=0))
    a, b = (int(x) for x in example.prompt[-1]["content"].split("*"))
    assert example.answer == str(a * b) and 0 <= a <= 9 and 0 <= b <= 9
    assert score(env, example, f" {a * b}\n").total == 1.0
    assert score(env, example, f"{a * b + 1}").total == 0.0


@pytest.mark.parametrize(
    ("env_id", "args", "message"),
    [
        ("no-such-env", {}, "unknown environment 'no-such-env' (known: agent, alphabet-sort, arithmetic, "
                            "calculator, dataset, reasoning-gym, reverse-text"),
        ("reverse-text", {"length": 3}, "has no argument(s) length (allowed: min_len, max_len, system_prompt)"),
        ("reverse-text", {"min_len": "5"}, "argument 'min_len' must be int"),
        ("reverse-text", {"min_len": 9, "max_len": 3}, "min_len <= max_len"),
        ("arithmetic", {"operators": "/"}, "operators must be"),
    ],
)
def test_bad_ids_and_args_are_user_errors(env_id, args, message):
    if env_id == "no-such-env" and importlib.util.find_spec("verifiers") is not None:
        pytest.skip("with verifiers installed an unknown id is looked up there")
    with pytest.raises(UserError) as err:
        load_env(env_id, **args)
    assert message in str(err.value)


def test_environment_class_by_import_path():
    env = load_env("prime_rl.envs.reverse_text:ReverseTextEnv", min_len=3, max_len=3)
    assert env.id == "reverse-text" and len(next(env.examples(0)).answer) == 3
    with pytest.raises(UserError, match="does not name an Environment subclass"):
        load_env("prime_rl.envs.rewards:lcs_ratio")
    with pytest.raises(UserError, match="cannot import module 'no_such_pkg.envs'"):
        load_env("no_such_pkg.envs:Env")


@pytest.mark.parametrize("env_id", ["reverse-text", "alphabet-sort", "arithmetic", "calculator", "reverse-text-hint"])
def test_generated_environments_have_no_example_ids(env_id):
    """A curriculum needs a finite pool with ids; a generated stream has none (a config error with a curriculum)."""
    assert load_env(env_id).example_pool() is None

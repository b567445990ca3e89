"""The verifiers adapter: against a stand-in for verifiers 0.2.1's API always, against the real
package when the 'verifiers' extra is installed (`uv sync --extra verifiers`)."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import sys
import textwrap
import types

import pytest

from prime_rl.envs import load_env
from prime_rl.utils.errors import UserError

HAS_VERIFIERS = importlib.util.find_spec("verifiers") is not None
ROWS = [{"prompt": [{"role": "user", "content": f"{i}+1"}], "answer": str(i + 1), "info": {"i": i}, "task": "math"}
        for i in range(5)]


def score(env, example, text):
    return asyncio.run(env.score(example, text))


class FakeState(dict):
    @classmethod
    def for_task(cls, task):
        return cls(task=dict(task), prompt=task["prompt"], answer=task["answer"], info=task["info"])


class FakeRubric:
    """score_rollout(state) as in verifiers 0.2.1: sets state['reward'] and state['metrics']."""

    has_group_rewards = False

    async def score_rollout(self, state):
        ok = float(state["completion"][-1]["content"].strip() == state["answer"])
        state["reward"], state["metrics"] = ok, {"correct": ok, "task_is_math": float(state["task"]["task"] == "math")}


class FakeSingleTurnEnv:
    def __init__(self, rows, rubric):
        self.rows, self.rubric = rows, rubric

    def get_dataset(self):
        return self.rows


def stand_in(load_environment) -> types.SimpleNamespace:
    return types.SimpleNamespace(load_environment=load_environment, SingleTurnEnv=FakeSingleTurnEnv, State=FakeState)


@pytest.fixture
def fake_verifiers(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "verifiers", module)
    return install


def test_adapter_with_a_stand_in_module(fake_verifiers):
    calls = []

    def load_environment(env_id, **args):
        calls.append((env_id, args))
        return FakeSingleTurnEnv(ROWS, FakeRubric())

    fake_verifiers(stand_in(load_environment))
    env = load_env("my-vf-env", difficulty=2)
    assert calls == [("my-vf-env", {"difficulty": 2})] and env.id == "my-vf-env"
    first = list(itertools.islice(env.examples(seed=0), 10))
    assert first == list(itertools.islice(env.examples(seed=0), 10))
    assert sorted(ex.answer for ex in first[:5]) == sorted(str(i + 1) for i in range(5))  # one pass = every row
    assert first[0].prompt == ROWS[first[0].info["verifiers_row"]]["prompt"] and first[0].info["task"] == "math"
    reward = score(env, first[0], first[0].answer)
    assert reward.total == 1.0 and reward.components == {"correct": 1.0, "task_is_math": 1.0}
    assert score(env, first[0], "nope").total == 0.0


def test_adapter_refuses_what_it_cannot_score(fake_verifiers):
    def failing(env_id, **args):
        raise FileNotFoundError("no such environment module")

    fake_verifiers(stand_in(failing))
    with pytest.raises(UserError, match="cannot load verifiers environment 'x' with args {}: no such environment"):
        load_env("x")
    fake_verifiers(stand_in(lambda env_id, **args: object()))
    with pytest.raises(UserError, match="only single-turn environments"):
        load_env("x")
    group = FakeRubric()
    group.has_group_rewards = True
    fake_verifiers(stand_in(lambda env_id, **args: FakeSingleTurnEnv(ROWS, group)))
    with pytest.raises(UserError, match="group-level reward functions"):
        load_env("x")
    fake_verifiers(stand_in(lambda env_id, **args: FakeSingleTurnEnv([], FakeRubric())))
    with pytest.raises(UserError, match="has no training dataset"):
        load_env("x")
    fake_verifiers(types.SimpleNamespace(__version__="0.4.0"))  # the agentic v1 API only
    with pytest.raises(UserError, match=r"verifiers 0.4.0 has no load_environment.*extra \(verifiers 0.2.1\)"):
        load_env("x")


ADD_ONE_ENV = '''
import verifiers as vf
from datasets import Dataset


def load_environment(num_examples: int = 5):
    rows = [{"question": f"{i}+1", "answer": str(i + 1), "info": {"i": i}, "task": "math"} for i in range(num_examples)]
    parser = vf.Parser()

    def correct(completion, answer, **kwargs) -> float:
        return float((parser.parse_answer(completion) or "").strip() == answer)

    def length(completion, **kwargs) -> float:
        return float(len(parser.parse_answer(completion) or ""))

    rubric = vf.Rubric(funcs=[correct, length], weights=[1.0, 0.0], parser=parser)
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Add one.", parser=parser, rubric=rubric)
'''


@pytest.mark.skipif(not HAS_VERIFIERS, reason="needs the 'verifiers' extra (uv sync --extra verifiers)")
def test_a_real_verifiers_environment_module(tmp_path, monkeypatch):
    (tmp_path / "vf_add_one.py").write_text(textwrap.dedent(ADD_ONE_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    env = load_env("vf-add-one", num_examples=3)
    examples = list(itertools.islice(env.examples(seed=1), 3))
    assert sorted(ex.answer for ex in examples) == ["1", "2", "3"]
    example = examples[0]
    assert example.prompt[0] == {"role": "system", "content": "Add one."}
    assert example.prompt[-1]["content"] == f"{int(example.answer) - 1}+1"
    right, wrong = score(env, example, example.answer), score(env, example, "nope")
    assert right.total == 1.0 and right.components["correct"] == 1.0
    assert wrong.total == 0.0 and wrong.components["length"] == 4.0  # weight 0: logged, not rewarded
    with pytest.raises(UserError, match="cannot load verifiers environment 'definitely-not-installed'"):
        load_env("definitely-not-installed")

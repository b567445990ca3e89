"""The verifiers 0.4 adapter against the real package (skipped when the 'verifiers' extra is not installed:
`uv sync --extra verifiers`). The tasksets are small modules put in `sys.modules` under their verifiers id
(verifiers imports a taskset by id), plus the tool taskset of `tests/support/tasksets/verifiers_envs.py`."""

from __future__ import annotations

import asyncio
import itertools
import sys
import types

import pytest

from prime_rl.chat.tool_calls import format_tool_call
from prime_rl.envs import load_env
from prime_rl.envs.environment import Rollout
from prime_rl.envs.verifiers_env import VerifiersEnv, VerifiersToolEnv
from prime_rl.utils.errors import UserError
from tests.support import TASKSETS

vf = pytest.importorskip("verifiers.v1", reason="the 'verifiers' extra is not installed")


@pytest.fixture(autouse=True)
def _tasksets_importable(monkeypatch):
    """verifiers imports a taskset as the top-level package named by its id."""
    monkeypatch.syspath_prepend(str(TASKSETS))


class MathData(vf.TaskData):
    answer: str = ""


class MathConfig(vf.TasksetConfig):
    size: int = 5


class MathTask(vf.Task[MathData]):
    @vf.reward(weight=2.0)
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.metric
    async def length(self, trace) -> float:
        return float(len(trace.last_reply))


class MathTaskset(vf.Taskset[MathTask, MathConfig]):
    def load(self):
        for i in range(self.config.size):
            yield MathTask(MathData(prompt=f"{i}+1", answer=str(i + 1), system_prompt="Answer with a number."))


class Counter(vf.Toolset):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @vf.tool
    def fail(self) -> str:
        """Always raises."""
        raise RuntimeError("broken tool")


class StopTask(MathTask):
    @classmethod
    def toolsets(cls, config):
        return [Counter(vf.ToolsetConfig())]

    @vf.stop
    def said_done(self, trace: vf.Trace) -> bool:
        return "done" in trace.last_reply


class StopTaskset(vf.Taskset[StopTask]):
    def load(self):
        yield StopTask(MathData(prompt="add 2 and 3", answer="5"))


class NeedsRuntime(MathTask):
    @vf.reward
    async def tests_pass(self, task, trace, runtime) -> float:
        return 1.0


class NeedsRuntimeTaskset(vf.Taskset[NeedsRuntime]):
    def load(self):
        yield NeedsRuntime(MathData(prompt="x"))


class EmptyTaskset(vf.Taskset[MathTask]):
    def load(self):
        return []


class PairEnv(vf.Env):
    async def run(self, task, agents):
        pass


@pytest.fixture
def tasksets(monkeypatch):
    """Each taskset class as the installed package of its verifiers id."""
    for name, exported in [("vf_math", [MathTaskset]), ("vf_stop", [StopTaskset]),
                           ("vf_runtime", [NeedsRuntimeTaskset]), ("vf_empty", [EmptyTaskset]),
                           ("vf_pair", [MathTaskset, PairEnv])]:
        module = types.ModuleType(name)
        module.__all__ = [cls.__name__ for cls in exported]
        for cls in exported:
            setattr(module, cls.__name__, cls)
        monkeypatch.setitem(sys.modules, name, module)


def run(coro):
    return asyncio.run(coro)


def test_a_taskset_without_tools_is_single_turn_scored_by_its_rewards_and_metrics(tasksets):
    env = load_env("vf-math", size=3)  # dashes become underscores, like verifiers' own loader
    assert isinstance(env, VerifiersEnv) and env.id == "vf-math" and not env.multi_turn and env.tools == []
    first = list(itertools.islice(env.examples(seed=0), 6))
    assert first == list(itertools.islice(env.examples(seed=0), 6))
    assert sorted(ex.answer for ex in first[:3]) == ["1", "2", "3"]  # one pass = every task, shuffled
    example = first[0]
    assert example.prompt == [{"role": "system", "content": "Answer with a number."},
                              {"role": "user", "content": f"{int(example.answer) - 1}+1"}]
    reward = run(env.score_rollout(example, Rollout([{"role": "assistant", "content": example.answer}])))
    assert reward.total == 2.0 and reward.components == {"correct": 1.0, "length": 1.0}
    assert run(env.score(example, "nope")).total == 0.0


def test_a_tool_taskset_runs_the_tool_methods_and_scores_the_whole_conversation():
    env = load_env("verifiers_envs", max_turns=3)
    assert isinstance(env, VerifiersToolEnv) and env.multi_turn and env.max_turns == 3
    assert [t["function"]["name"] for t in env.tools] == ["echo"]
    assert env.tools[0]["function"]["parameters"]["properties"]["text"] == {"type": "string",
                                                                            "description": "what to echo"}
    example = next(env.examples(seed=1))
    call = {"role": "assistant", "content": format_tool_call("echo", {"text": example.answer})}
    state = env.initial_state(example)
    reply = run(env.respond(example, [call], state))
    assert not reply.done and reply.tool_calls == 1 and reply.tool_errors == ()
    assert reply.messages == [{"role": "tool", "tool_call_id": "call_0", "name": "echo", "content": example.answer}]
    answer = {"role": "assistant", "content": f"it is {example.answer}"}
    assert run(env.respond(example, [call, *reply.messages, answer], state)).done  # no call: the rollout ends
    reward = run(env.score_rollout(example, Rollout([call, *reply.messages, answer])))
    assert reward.total == 1.0 and reward.components == {"letters": 1.0, "calls": 1.0}


def test_the_trace_carries_tool_calls_as_structured_calls_and_tool_messages():
    env = load_env("verifiers_envs")
    example = next(env.examples())
    text = "let me see " + format_tool_call("echo", {"text": "x"})
    trace = env._trace(example, [{"role": "assistant", "content": text},
                                 {"role": "tool", "tool_call_id": "call_0", "name": "echo", "content": "x"}])
    (assistant,) = trace.assistant_messages
    assert assistant.content == "let me see"
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [("call_0", "echo", '{"text": "x"}')]
    assert trace.tool_messages[0].tool_call_id == "call_0" and trace.messages[0].role == "user"


def test_tool_errors_and_stop_predicates(tasksets):
    env = load_env("vf_stop")
    assert [t["function"]["name"] for t in env.tools] == ["counter_add", "counter_fail"]  # verifiers' server prefix
    example = next(env.examples())
    calls = format_tool_call("counter_add", {"a": 2, "b": 3}) + format_tool_call("counter_fail", {}) \
        + format_tool_call("nope", {}) + "<tool_call>{bad</tool_call>"
    reply = run(env.respond(example, [{"role": "assistant", "content": calls}], {}))
    assert [m["content"][:6] for m in reply.messages] == ["5", "error:", "error:", "error:"]
    assert reply.tool_calls == 4 and reply.tool_errors == ("exception", "unknown_tool", "bad_json")
    state = {}
    done = run(env.respond(example, [{"role": "assistant", "content": "done " + calls}], state))
    assert done.done and state["stop_condition"] == "said_done"


@pytest.mark.parametrize(("env_id", "args", "message"), [
    ("vf_nowhere", {}, "cannot load verifiers environment 'vf_nowhere'"),
    ("vf_math", {"sise": 2}, "cannot load verifiers environment 'vf_math' with args {'sise': 2}"),
    ("vf_empty", {}, "verifiers environment 'vf_empty' has no tasks"),
    ("vf_pair", {}, "'vf_pair' ships its own Env (PairEnv): multi-agent envs cannot run"),
    ("vf_runtime", {}, "'vf_runtime' cannot run in prime-rl: reward tests_pass needs a runtime"),
    ("vf_math", {"max_turns": 2}, "'vf_math' has no tools: arguments max_turns do not apply"),
])
def test_what_cannot_run_is_a_one_line_user_error_naming_the_env(tasksets, env_id, args, message):
    with pytest.raises(UserError) as err:
        load_env(env_id, **args)
    assert message in str(err.value) and "\n" not in str(err.value)

"""Agent rollouts end to end in the orchestrator's process (`orchestrator/agent_rollouts.py`): the gateway served on
loopback, real agents (the OpenAI Agents SDK, a plain `openai` loop, commands) in front of a scripted server on
the real Qwen3 and Llama 3 tokenizers and templates, what each rollout trains, and every way an agent fails."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from prime_rl.envs.agent import AgentEnvironment
from prime_rl.envs.environment import Example
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.agent_gateway import AgentGateway
from prime_rl.orchestrator.agent_rollouts import AgentRunner
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.draws import Draw
from prime_rl.orchestrator.env_calls import EnvironmentFailed
from prime_rl.orchestrator.metrics import rollout_metrics
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.rollouts import GroupGenerator, RolloutSettings
from tests.support import REPO
from tests.support.agent_sessions import ScriptedServer, sampled_runs

HERE = "tests.orchestrator.test_agent_rollouts"
EXAMPLE = Example([{"role": "user", "content": "2*3 and 2+3?"}], "6 and 5", {})
PARALLEL_CALLS = ('<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
                  '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>')


async def four_turn_agent(client, example):
    messages = [dict(m) for m in example.prompt]
    for turn in range(4):
        reply = (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message
        messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": f"and {turn}?"}]


async def editing_agent(client, example):
    """Three history edits: a removed message, a changed tool result, the same call sent twice."""
    ask = client.chat.completions.create
    question, go_on = dict(example.prompt[0]), {"role": "user", "content": "go on"}
    reply = (await ask(model="policy", messages=[question])).choices[0].message
    await ask(model="policy", messages=[question, reply.model_dump(exclude_none=True), go_on])
    await ask(model="policy", messages=[question, go_on])  # the reply removed: history_edit
    await ask(model="policy", messages=[question, go_on])  # the same call again: retry


async def raising_agent(client, example):
    await client.chat.completions.create(model="policy", messages=list(example.prompt))
    raise RuntimeError("the agent's own bug")


async def silent_agent(client, example):
    return 1.0


async def slow_agent(client, example):
    await client.chat.completions.create(model="policy", messages=list(example.prompt))  # the server is slow


async def bad_reward_agent(client, example):
    await client.chat.completions.create(model="policy", messages=list(example.prompt))
    return "high"


def draw_for(on_error: str = "zero", **args) -> Draw:
    env = AgentEnvironment(task={"id": "calculator"}, **args)
    return Draw("agent", env, EXAMPLE, EnvConfig(id="agent", args={"task": {"id": "calculator"}, **args},
                                                 on_error=on_error))


def generate(server: ScriptedServer, draw: Draw, n: int = 2, seq_len: int = 4096):
    """One group of `draw` through a GroupGenerator with an AgentRunner (served on loopback), and the runner."""
    runner = AgentRunner(AgentGateway(server, server.chat, seq_len, "policy"))
    generator = GroupGenerator(server, n, SamplingRule(1.0), RolloutSettings(64), agents=runner)

    async def run():
        try:
            (group,) = await generator.generate([draw], [11])
            return group
        finally:
            await runner.stop()

    return asyncio.run(run()), runner


@pytest.mark.slow  # imports the Agents SDK (~3 s)
@pytest.mark.parametrize("tokenizer", ["qwen3", "llama3"])
def test_the_examples_agents_sdk_agent_with_two_tools_and_a_parallel_call_trains_exactly_the_sampled_ids(tokenizer):
    def reply(prompt: str) -> str:
        answered = "<tool_response>" in prompt or "tool<|end_header_id|>" in prompt  # Qwen3's or Llama 3's
        return "6 and 5" if answered else PARALLEL_CALLS

    server = ScriptedServer(reply, tokenizer)
    group, runner = generate(server, draw_for(function="examples/agent/agents_sdk.py:run"), n=1)
    assert group.errors == [None] and group.rewards == [1.0]  # the task scored the SDK's final answer
    ((prompt_ids, completion),) = group.trained(0)  # one segment: the tool results extend it
    assert sampled_runs(SimpleNamespace(token_ids=completion.token_ids, mask=completion.mask)) == server.sampled
    sampled_logprobs = [lp for lp, keep in zip(completion.logprobs, completion.mask, strict=True) if keep]
    assert sampled_logprobs == [-call / 100 for call, ids in enumerate(server.sampled, 1) for _ in ids]
    assert completion.weight_steps == [call for call, ids in enumerate(server.sampled, 1) for _ in ids]
    assert all(lp == 0 for lp, keep in zip(completion.logprobs, completion.mask, strict=True) if not keep)
    stats = group.stats[0]
    assert (stats.turns, stats.tool_calls, stats.segments, sum(stats.forks.values())) == (2, 2, 1, 0)
    assert completion.text == "6 and 5" and not runner.gateway.sessions


def test_a_plain_openai_agent_over_four_turns_is_one_sample_scored_by_the_task():
    server = ScriptedServer(lambda prompt: "6 and 5")
    group, _ = generate(server, draw_for(function=f"{HERE}:four_turn_agent"), n=1)
    ((_, completion),) = group.trained(0)
    assert group.stats[0].turns == 4 and sampled_runs(SimpleNamespace(token_ids=completion.token_ids,
                                                                      mask=completion.mask)) == server.sampled
    assert group.rewards == [1.0] and group.components[0]["exact_match"] == 1.0  # the calculator task scored it


def test_every_history_edit_is_a_sample_of_its_own_with_the_rollouts_advantage():
    server = ScriptedServer(lambda prompt: "ok")
    group, _ = generate(server, draw_for(function=f"{HERE}:editing_agent"), n=1)
    pieces = group.trained(0)
    assert [len(sampled_runs(SimpleNamespace(token_ids=c.token_ids, mask=c.mask))) for _, c in pieces] == [2, 1, 1]
    assert dict(group.stats[0].forks) == {"history_edit": 1, "retry": 1} and group.stats[0].segments == 3
    trained = [t for _, c in pieces for t, keep in zip(c.token_ids, c.mask, strict=True) if keep]
    assert trained == [t for ids in server.sampled for t in ids]  # every sampled id trains, once
    stub = SimpleNamespace(config=SimpleNamespace(mask_truncated=False, seq_len=4096))
    samples = Orchestrator.samples(stub, [group], torch.tensor([[0.5]]))
    assert [s.prompt_ids for s in samples] == [p for p, _ in pieces]
    assert [(s.advantage, s.reward, s.group) for s in samples] == [(0.5, group.rewards[0], 0)] * 3
    metrics = rollout_metrics([group], 0)
    assert metrics["rollout/segments_mean"] == 3 and metrics["rollout/forks/retry"] == 1
    assert metrics["seq_len/prompt_mean"] == sum(len(p) for p, _ in pieces) / 3


@pytest.mark.parametrize("agent, why", [
    ("raising_agent", "the agent failed: RuntimeError: the agent's own bug"),
    ("silent_agent", "the agent never called the model"),
    ("bad_reward_agent", "a reward must be a finite number"),
])
def test_an_agent_that_fails_fails_its_rollout_and_nothing_of_it_stays_open(agent, why):
    server = ScriptedServer(lambda prompt: "ok")
    group, runner = generate(server, draw_for(function=f"{HERE}:{agent}"))
    assert group.rewards == [0.0, 0.0] and all(why in error for error in group.errors), group.errors
    assert not runner.gateway.sessions


def test_an_agent_past_its_time_limit_fails_and_its_call_in_flight_is_dropped():
    server = ScriptedServer(lambda prompt: "ok", delay_s=2.0)
    started = time.monotonic()
    group, runner = generate(server, draw_for(function=f"{HERE}:slow_agent", timeout_s=0.3))
    assert time.monotonic() - started < 2.0 + 1.5
    assert all("longer than timeout_s = 0.3s" in e for e in group.errors) and group.rewards == [0.0, 0.0]
    assert group.trained(0) == [] and not runner.gateway.sessions


def test_on_error_fail_ends_the_run_with_the_agents_failure():
    with pytest.raises(EnvironmentFailed, match="the agent never called the model"):
        generate(ScriptedServer(lambda prompt: "ok"), draw_for("fail", function=f"{HERE}:silent_agent"))


def command(tmp_path, body: str) -> list[str]:
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


@pytest.mark.slow  # starts Python processes
def test_a_command_agent_reads_its_session_from_the_environment_and_prints_its_reward(tmp_path):
    argv = command(tmp_path, """
        import json, sys
        import openai
        example = json.load(sys.stdin)
        client = openai.OpenAI()  # OPENAI_BASE_URL, OPENAI_API_KEY
        reply = client.chat.completions.create(model="policy", messages=example["prompt"]).choices[0].message
        print("some log line")
        print(json.dumps({"reward": 0.25, "components": {"said": float(reply.content == "ok")}}))
    """)
    group, _ = generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=argv), n=2)
    assert group.errors == [None, None] and group.rewards == [0.25, 0.25]
    assert group.components == [{"said": 1.0}] * 2


@pytest.mark.slow  # starts Python processes
@pytest.mark.parametrize("body, why", [
    ("import sys; sys.stderr.write('boom\\n'); sys.exit(1)", "command exited with code 1: boom"),
    ("print('not json')", "is not a reward"),
    ("print(1)", "the agent never called the model"),
])
def test_a_command_that_fails_fails_its_rollout(tmp_path, body, why):
    group, _ = generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=command(tmp_path, body)), n=1)
    assert group.rewards == [0.0] and why in group.errors[0], group.errors


@pytest.mark.slow  # starts Python processes
def test_a_command_past_its_time_limit_is_killed_with_its_whole_process_group(tmp_path):
    pids = tmp_path / "pids"
    argv = command(tmp_path, f"""
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "60"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
    """)
    group, _ = generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=argv, timeout_s=3.0), n=1)
    assert "longer than timeout_s = 3s" in group.errors[0]
    assert not any(alive(int(pid)) for pid in pids.read_text().split())


def test_bad_agent_configs_are_one_line_at_config_time(tmp_path):
    cases = [
        ({"function": "no_such_module:run"}, "cannot import module 'no_such_module'"),
        ({"function": f"{HERE}:EXAMPLE"}, "must be an async function"),
        ({"function": f"{tmp_path}/missing.py:run"}, "no such file"),
        ({"command": ["no-such-agent-binary"]}, "command 'no-such-agent-binary' not found"),
        ({"command": []}, "set exactly one of function"),
        ({"function": f"{HERE}:silent_agent", "command": ["python"]}, "set exactly one of function"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            EnvConfig(id="agent", args={"task": {"id": "calculator"}, **args})
    with pytest.raises(ValueError, match="task must be a table"):
        EnvConfig(id="agent", args={"function": f"{HERE}:silent_agent"})
    with pytest.raises(ValueError, match="cannot itself be an agent"):
        EnvConfig(id="agent", args={"function": f"{HERE}:silent_agent", "task": {"id": "agent"}})


ORCHESTRATOR_SCRIPT = """
import sys
from tests.orchestrator.test_agent_rollouts import ScriptedServer, draw_for, generate
generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=sys.argv[1:], timeout_s=600.0), n=3)
"""


@pytest.mark.slow
def test_agent_commands_die_with_a_killed_orchestrator(tmp_path):
    pids = tmp_path / "pids"
    argv = command(tmp_path, f"""
        import os, time
        with open({str(pids)!r}, "a") as out:
            out.write(f"{{os.getpid()}}\\n")
        time.sleep(600)
    """)
    orchestrator = subprocess.Popen([sys.executable, "-c", ORCHESTRATOR_SCRIPT, *argv], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not (pids.exists() and len(pids.read_text().split()) == 3):
            assert time.monotonic() < deadline and orchestrator.poll() is None, "the agents did not start"
            time.sleep(0.1)
        orchestrator.kill()  # SIGKILL: no finally, no cleanup of its own
        orchestrator.wait()
        deadline = time.monotonic() + 10
        while any(alive(int(pid)) for pid in pids.read_text().split()):
            assert time.monotonic() < deadline, "an agent command outlived the orchestrator"
            time.sleep(0.1)
    finally:
        orchestrator.kill()
        for pid in map(int, pids.read_text().split() if pids.exists() else ()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie waiting for init to reap it does not)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # starts the example's MCP server (~1.5 s)
def test_an_agent_takes_its_tools_from_an_mcp_server():
    def reply(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return prompt.rsplit("<tool_response>\n", 1)[1].split("\n", 1)[0]  # the tool's answer, repeated
        return '<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

    server = ScriptedServer(reply)
    draw = Draw("agent", AgentEnvironment(task={"id": "calculator"}, function="examples/agent/mcp_loop.py:run"),
                Example([{"role": "user", "content": "2*3"}], "6", {}), EnvConfig())
    group, _ = generate(server, draw, n=2)
    assert group.errors == [None, None] and group.rewards == [1.0, 1.0]  # "6" came from the MCP server
    assert [s.tool_calls for s in group.stats] == [1, 1] and [s.segments for s in group.stats] == [1, 1]

"""Agent rollouts end to end in the orchestrator's process (`rollouts/agents/runner.py`): the gateway served on
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
from prime_rl.orchestrator.config import EnvConfig, OrchestratorConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.metrics import rollout_metrics
from prime_rl.orchestrator.orchestrator import Orchestrator
from prime_rl.orchestrator.rollouts.agents.gateway import AgentGateway
from prime_rl.orchestrator.rollouts.agents.runner import AgentRunner
from prime_rl.orchestrator.rollouts.env_calls import EnvironmentFailed
from prime_rl.orchestrator.rollouts.generator import GroupGenerator
from prime_rl.orchestrator.rollouts.seam import RolloutSettings
from tests.support import REPO
from tests.support.agent_sessions import ScriptedServer, sampled_runs

HERE = "tests.orchestrator.rollouts.agents.test_runner"
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


async def exiting_agent(client, example):
    await client.chat.completions.create(model="policy", messages=list(example.prompt))
    raise SystemExit(3)  # a library's sys.exit: the rollout's end, not the orchestrator's


async def parts_agent(client, example):
    """An SDK-style call whose content is a list of text parts."""
    parts = [{"type": "input_text", "text": "2*3"}, {"type": "text", "text": " and 2+3?"}]
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": parts}])
    return 1.0


async def numpy_reward_agent(client, example):
    import numpy as np

    await client.chat.completions.create(model="policy", messages=list(example.prompt))
    return np.float32(0.5)


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
    generator = GroupGenerator({"agent": runner}, n, SamplingRule(1.0), RolloutSettings(64))

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
    def reply(prompt: str) -> str:  # two turns of parallel calls (tool results: Qwen3's or Llama 3's), then the answer
        answered = prompt.count("<tool_response>") + prompt.count("tool<|end_header_id|>")
        return "6 and 5" if answered >= 4 else PARALLEL_CALLS

    server = ScriptedServer(reply, tokenizer)
    group, runner = generate(server, draw_for(function="examples/agent/agents_sdk.py:run"), n=1)
    assert group.errors == [None] and group.rewards == [1.0]  # the task scored the SDK's final answer
    ((prompt_ids, completion, _),) = group.trained(0)  # one segment: the tool results extend it
    assert sampled_runs(completion) == server.sampled
    sampled_logprobs = [lp for lp, keep in zip(completion.logprobs, completion.mask, strict=True) if keep]
    assert sampled_logprobs == [-call / 100 for call, ids in enumerate(server.sampled, 1) for _ in ids]
    assert completion.weight_steps == [call for call, ids in enumerate(server.sampled, 1) for _ in ids]
    assert all(lp == 0 for lp, keep in zip(completion.logprobs, completion.mask, strict=True) if not keep)
    stats = group.stats[0]  # the second turn's calls got ids of their own (the SDK refuses a reused one)
    assert (stats.turns, stats.tool_calls, stats.segments, sum(stats.forks.values())) == (3, 4, 1, 0)
    assert completion.text == "6 and 5" and not runner.gateway.sessions


@pytest.mark.slow
def test_a_plain_openai_agent_over_four_turns_is_one_sample_scored_by_the_task():
    server = ScriptedServer(lambda prompt: "6 and 5")
    group, _ = generate(server, draw_for(function=f"{HERE}:four_turn_agent"), n=1)
    ((_, completion, _),) = group.trained(0)
    assert group.stats[0].turns == 4 and sampled_runs(completion) == server.sampled
    assert group.rewards == [1.0] and group.components[0]["exact_match"] == 1.0  # the calculator task scored it


def test_every_history_edit_is_a_sample_of_its_own_with_the_rollouts_advantage():
    server = ScriptedServer(lambda prompt: "ok")
    group, _ = generate(server, draw_for(function=f"{HERE}:editing_agent"), n=1)
    pieces = group.trained(0)
    runs = [sampled_runs(c) for _, c, _ in pieces]
    assert [len(r) for r in runs] == [2, 1, 1]
    assert dict(group.stats[0].forks) == {"history_edit": 1, "retry": 1} and group.stats[0].segments == 3
    trained = [t for _, c, _ in pieces for t, keep in zip(c.token_ids, c.mask, strict=True) if keep]
    assert trained == [t for ids in server.sampled for t in ids]  # every sampled id trains, once
    stub = SimpleNamespace(config=SimpleNamespace(mask_truncated=False, seq_len=4096))
    samples = Orchestrator.samples(stub, [group], torch.tensor([[0.5]]))
    assert [s.prompt_ids for s in samples] == [p.prompt_ids for p in pieces]
    assert [(s.advantage, s.reward, s.group) for s in samples] == [(0.5, group.rewards[0], 0)] * 3
    metrics = rollout_metrics([group], 0)
    assert metrics["rollout/segments_mean"] == 3 and metrics["rollout/forks/retry"] == 1
    assert metrics["seq_len/prompt_mean"] == sum(len(p.prompt_ids) for p in pieces) / 3


def test_a_turn_discount_gives_each_call_its_share_of_the_rollouts_advantage():
    server = ScriptedServer(lambda prompt: "ok")
    group, _ = generate(server, draw_for(function=f"{HERE}:editing_agent", turn_discount=0.5), n=1)
    stub = SimpleNamespace(config=SimpleNamespace(mask_truncated=False, seq_len=4096))
    samples = Orchestrator.samples(stub, [group], torch.tensor([[-2.0]]))  # 4 calls over 3 segments: 2, 1, 1
    shares = [sorted({a for a, keep in zip(s.token_advantages, s.completion_mask, strict=True) if keep})
              for s in samples]
    assert shares == [[-0.5, -0.25], [-1.0], [-2.0]]  # gamma^3, gamma^2 | gamma | 1 of -2 (sorted ascending)
    assert all(s.advantage == -2.0 for s in samples)


def test_a_turn_discount_is_refused_where_another_advantage_replaces_the_orchestrators():
    env = {"id": "agent", "args": {"task": {"id": "calculator"}, "function": f"{HERE}:silent_agent",
                                   "turn_discount": 0.9}}
    OrchestratorConfig(env=[env])
    with pytest.raises(ValueError, match="turn_discount scales the orchestrator's advantage per token"):
        OrchestratorConfig(env=[env], advantage={"type": "reinforce_plus_plus"})
    with pytest.raises(ValueError, match="need 0 < turn_discount <= 1"):
        EnvConfig(id="agent", args={**env["args"], "turn_discount": 0})


@pytest.mark.parametrize("agent, why", [
    ("raising_agent", "the agent failed: RuntimeError: the agent's own bug"),
    ("exiting_agent", "the agent failed: RuntimeError: it called sys.exit(3)"),
    ("silent_agent", "the agent never called the model"),
    ("bad_reward_agent", "a reward must be a finite number"),
])
def test_an_agent_that_fails_fails_its_rollout_and_nothing_of_it_stays_open(agent, why):
    server = ScriptedServer(lambda prompt: "ok")
    group, runner = generate(server, draw_for(function=f"{HERE}:{agent}"))
    assert group.rewards == [0.0, 0.0] and all(why in error for error in group.errors), group.errors
    assert group.trained(0) == group.trained(1) == [] and not runner.gateway.sessions  # nothing of it trains


@pytest.mark.slow
def test_an_agent_past_its_time_limit_fails_and_its_call_in_flight_is_dropped():
    server = ScriptedServer(lambda prompt: "ok", delay_s=60.0)
    started = time.monotonic()
    group, runner = generate(server, draw_for(function=f"{HERE}:slow_agent", timeout_s=0.3))
    assert time.monotonic() - started < 30  # not the server's 60 s
    assert all("longer than timeout_s = 0.3s" in e for e in group.errors) and group.rewards == [0.0, 0.0]
    assert group.trained(0) == [] and not runner.gateway.sessions


def test_text_parts_are_text_and_a_numpy_reward_is_a_number():
    server = ScriptedServer(lambda prompt: "ok")
    group, _ = generate(server, draw_for(function=f"{HERE}:parts_agent"), n=1)
    assert group.errors == [None] and group.rewards == [1.0]
    assert "2*3 and 2+3?" in server.chat.tokenizer.decode(group.trained(0)[0].prompt_ids)
    group, _ = generate(server, draw_for(function=f"{HERE}:numpy_reward_agent"), n=1)
    assert group.errors == [None] and group.rewards == [0.5]


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
def test_a_command_sees_its_session_not_the_runs_settings_and_may_leave_a_child_holding_its_output(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PRIME_CLIENT__API_KEY", "the-inference-servers-key")
    argv = command(tmp_path, """
        import json, os, subprocess, sys
        import openai
        subprocess.Popen(["sleep", "60"])  # inherits stdout and stderr, outlives the command
        example = json.load(sys.stdin)
        openai.OpenAI().chat.completions.create(model="policy", messages=example["prompt"])
        sys.stderr.write("x" * 200_000)
        print(json.dumps(float("PRIME_CLIENT__API_KEY" not in os.environ)))
    """)
    started = time.monotonic()
    group, _ = generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=argv, timeout_s=30.0), n=1)
    assert group.errors == [None] and group.rewards == [1.0] and time.monotonic() - started < 20


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
    group, _ = generate(ScriptedServer(lambda prompt: "ok"), draw_for(command=argv, timeout_s=5.0), n=1)
    assert "longer than timeout_s = 5s" in group.errors[0]
    assert not any(alive(int(pid)) for pid in pids.read_text().split())


@pytest.mark.parametrize("args, message", [
    ('function = "no_such_module:run"', "cannot import module 'no_such_module'"),
    ('function = "examples/agent/openai_loop.py:walk"', "has no 'walk'"),
    ('function = "tests.orchestrator.rollouts.agents.test_runner:EXAMPLE"', "must be an async function"),
    ('function = "agents/missing.py:run"', "no such file: agents/missing.py"),
    ('command = ["no-such-agent-binary"]', "command 'no-such-agent-binary' not found"),
    ('command = []', "set exactly one of function"),
    ('command = "python agent.py"', "command must be a non-empty list of strings"),
    ('command = ["python", "agents/missing.py"]', "command's script 'agents/missing.py' not found"),
    ('function = "examples/agent/openai_loop.py:run", command = ["python"]', "set exactly one of function"),
    ('function = "examples/agent/openai_loop.py:run", task = { id = "agent" }', "cannot itself be an agent"),
    ('function = "examples/agent/openai_loop.py:run", task = "calculator"', "task must be a table"),
])
def test_a_bad_agent_config_is_one_line_and_exit_code_2_before_anything_starts(tmp_path, capsys, args, message):
    from prime_rl.launch.rl import main

    if "task" not in args:
        args += ', task = { id = "calculator" }'
    config = tmp_path / "rl.toml"
    config.write_text(f'[[orchestrator.env]]\nid = "agent"\nargs = {{ {args} }}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["@", str(config), "--model.name", "tiny-calculator", "--output-dir", str(tmp_path / "run"),
              "--dry-run"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


ORCHESTRATOR_SCRIPT = """
import sys
from tests.orchestrator.rollouts.agents.test_runner import ScriptedServer, draw_for, generate
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

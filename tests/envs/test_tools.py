"""Tool environments: every failing call (malformed, unknown, bad arguments, raising, hanging, huge) is a tool message
and an error kind, never an exception; the calculator environment's demonstration, replayed, and its scoring."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from prime_rl.chat.tool_calls import format_tool_call
from prime_rl.envs import load_env
from prime_rl.envs.environment import EnvReply, Example, Reward, Rollout
from prime_rl.envs.tools import ToolEnvironment
from prime_rl.utils.errors import UserError
from tests.support import REPO

ROOT = REPO
TIMEOUT_S = 0.5
EXAMPLE = Example(prompt=[{"role": "user", "content": "go"}], answer="")


def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * times


def explode(reason: str) -> str:
    """Fail."""
    raise ValueError(f"cannot {reason}")


def hang(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "woke up"


def huge() -> str:
    """Ten megabytes."""
    return "x" * 10_000_000


def table() -> dict:
    """A dict."""
    return {"a": [1, 2]}


def quit_now(code: int) -> str:
    """Exit, as an argparse-based helper does on bad input."""
    raise SystemExit(code)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message")


def mumble() -> str:
    """Raise an exception whose message cannot be printed."""
    raise Unprintable()


def listing() -> str:
    """A file name that is no valid UTF-8, as os.listdir gives it (a lone surrogate)."""
    return "ok.txt\nbad-\udcff.txt"


async def slow_echo(text: str, delay: float = 0.0) -> str:
    """Echo after a delay, on the event loop."""
    await asyncio.sleep(delay)
    return text


class Toolbox(ToolEnvironment):
    id = "toolbox"

    def __init__(self, max_turns: int = 4, tool_timeout_s: float = TIMEOUT_S, max_tool_output_chars: int = 100):
        super().__init__(max_turns, tool_timeout_s, max_tool_output_chars)

    def tool_functions(self):
        return [echo, explode, hang, huge, table, slow_echo, quit_now, mumble, listing]

    def examples(self, seed: int = 0):
        return itertools.repeat(EXAMPLE)

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        return Reward(0.0)


def respond(env: ToolEnvironment, text: str, state: dict | None = None) -> EnvReply:
    messages = [{"role": "assistant", "content": text}]
    return asyncio.run(env.respond(EXAMPLE, messages, env.initial_state(EXAMPLE) if state is None else state))


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


def test_tools_are_the_schemas_of_the_functions():
    env = Toolbox()
    assert [t["function"]["name"] for t in env.tools][:6] == ["echo", "explode", "hang", "huge", "table", "slow_echo"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["text"]


def test_a_turn_without_a_call_ends_the_rollout():
    assert respond(Toolbox(), "the answer is 4") == EnvReply(done=True)
    user_last = [{"role": "user", "content": call("echo", text="a")}]
    assert asyncio.run(Toolbox().respond(EXAMPLE, user_last, {})) == EnvReply(done=True)


def test_calls_are_answered_in_order_and_counted_in_state():
    env = Toolbox()
    state = env.initial_state(EXAMPLE)
    reply = respond(env, f"{call('echo', text='ab', times=2)}{call('table')}{call('slow_echo', text='hi')}", state)
    assert not reply.done and reply.tool_calls == 3 and reply.tool_errors == ()
    assert reply.messages == [
        {"role": "tool", "tool_call_id": "call_0", "name": "echo", "content": "abab"},
        {"role": "tool", "tool_call_id": "call_1", "name": "table", "content": '{"a": [1, 2]}'},
        {"role": "tool", "tool_call_id": "call_2", "name": "slow_echo", "content": "hi"},
    ]
    respond(env, "<tool_call>{oops</tool_call>", state)
    assert state == {"tool_calls": 4, "tool_errors": 1}


@pytest.mark.parametrize(("text", "kind", "message"), [
    ("<tool_call>{oops</tool_call>", "bad_json", "error: not valid JSON"),
    ('<tool_call>{"name": "echo", "arguments": {"text": "a"}', "bad_json", "error: unclosed <tool_call>"),
    (call("rm", path="/"), "unknown_tool", "error: unknown tool 'rm' (tools: echo, explode, hang, huge, table"),
    (call("echo"), "bad_arguments", "error: bad arguments for echo: missing a required argument: 'text'"),
    (call("echo", text="a", loud=True), "bad_arguments", "error: bad arguments for echo: got an unexpected keyword"),
    (call("echo", text="a", times="2"), "bad_arguments", "error: bad arguments for echo: 'times' must be integer"),
    (call("echo", text="a", times=True), "bad_arguments", "'times' must be integer, got true"),
    (call("explode", reason="fly"), "exception", "error: ValueError: cannot fly"),
])
def test_each_failure_is_a_tool_message_naming_the_problem(text, kind, message):
    reply = respond(Toolbox(), text)
    (answer,) = reply.messages
    assert not reply.done and reply.tool_calls == 1 and reply.tool_errors == (kind,)
    assert answer["role"] == "tool" and answer["tool_call_id"] == "call_0"
    assert answer["content"].startswith("error: ") and message in answer["content"], answer["content"]


@pytest.mark.parametrize("tool", ["hang", "slow_echo"])
@pytest.mark.slow
def test_a_hanging_tool_times_out_without_holding_the_rollout(tool):
    arguments = {"seconds": 30.0} if tool == "hang" else {"text": "late", "delay": 30.0}
    start = time.monotonic()
    reply = respond(Toolbox(), f"{call(tool, **arguments)}{call('echo', text='after')}")
    elapsed = time.monotonic() - start
    assert TIMEOUT_S - 0.05 <= elapsed < TIMEOUT_S + 2.0
    assert reply.tool_errors == ("timeout",)
    assert reply.messages[0]["content"] == f"error: {tool} timed out after {TIMEOUT_S:g}s"
    assert reply.messages[1]["content"] == "after"  # the next call still runs


@pytest.mark.slow
def test_a_hung_tool_thread_does_not_keep_the_process_alive():
    script = textwrap.dedent("""
        import asyncio, time
        from prime_rl.chat.tool_calls import format_tool_call
        from tests.envs.test_tools import EXAMPLE, Toolbox
        env = Toolbox(tool_timeout_s=0.2)
        messages = [{"role": "assistant", "content": format_tool_call("hang", {"seconds": 600.0})}]
        reply = asyncio.run(env.respond(EXAMPLE, messages, {}))
        print(reply.tool_errors)
    """)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "('timeout',)"
    assert time.monotonic() - start < 60  # import time; a joined thread would hold the exit for 600 s


def test_a_ten_megabyte_output_is_cut_to_a_short_message_quickly():
    start = time.monotonic()
    reply = respond(Toolbox(), call("huge"))
    assert time.monotonic() - start < 2.0
    content = reply.messages[0]["content"]
    assert reply.tool_errors == () and content.startswith("x" * 100)
    assert content == "x" * 100 + "...[9999900 chars cut]"


def test_constructor_arguments_are_checked():
    with pytest.raises(UserError, match="environment 'toolbox': tool_timeout_s must be > 0"):
        Toolbox(tool_timeout_s=0.0)

    class Twice(Toolbox):
        def tool_functions(self):
            return [echo, echo]

    with pytest.raises(ValueError, match="two tools named 'echo'"):
        Twice()


def test_calculator_demonstration_replays_through_respond_identically():
    env = load_env("calculator", min_operand=100, max_operand=999)
    for example in itertools.islice(env.examples(seed=1), 5):
        demo = env.demonstration(example)
        assert [m["role"] for m in demo] == ["assistant", "tool", "assistant"]
        a, b = example.info["a"], example.info["b"]
        assert 100 <= a <= 999 and 100 <= b <= 999 and example.prompt[-1]["content"] == f"{a}*{b}"
        assert demo[-1]["content"] == example.answer == str(a * b) == demo[1]["content"]
        state = env.initial_state(example)
        reply = asyncio.run(env.respond(example, demo[:1], state))
        assert reply.messages == demo[1:2] and reply.tool_errors == ()
        assert asyncio.run(env.respond(example, demo, state)).done
        assert all(c.isascii() and (c.isprintable() or c == "\n") for m in demo for c in m["content"])
        assert asyncio.run(env.score_rollout(example, Rollout(demo))) == Reward(1.0, {"exact_match": 1.0,
                                                                                       "tool_used": 1.0})


def test_calculator_scoring():
    env = load_env("calculator")
    assert env.max_turns == 3 and env.system_prompt == "" and "system" not in [m["role"] for m in
                                                                                next(env.examples()).prompt]
    example = next(env.examples(seed=0))
    answer = example.answer

    def score(*messages: dict) -> Reward:
        return asyncio.run(env.score_rollout(example, Rollout(list(messages))))

    assert score({"role": "assistant", "content": f" {answer}\n"}) == Reward(1.0, {"exact_match": 1.0,
                                                                                     "tool_used": 0.0})
    assert score({"role": "assistant", "content": str(int(answer) + 1)}).total == 0.0
    # The final answer is the last turn's text with its call blocks removed; a failed call is no tool use.
    failed = [{"role": "assistant", "content": call("divide", a=1, b=2)},
              {"role": "tool", "content": "error: unknown tool 'divide'"}]
    assert score(*failed, {"role": "assistant", "content": f"{call('add', a=1, b=1)}{answer}"}) == Reward(
        1.0, {"exact_match": 1.0, "tool_used": 0.0})
    assert score({"role": "assistant", "content": call("multiply", a=1, b=2)}).total == 0.0
    with pytest.raises(UserError, match="min_operand <= max_operand"):
        load_env("calculator", min_operand=50, max_operand=10)
    assert load_env("calculator", system_prompt="Use the tools.").demonstration(example)[-1]["content"] == answer


def test_a_tool_that_exits_or_whose_error_cannot_be_printed_is_an_exception_message():
    reply = respond(Toolbox(), f"{call('quit_now', code=3)}{call('mumble')}")
    assert reply.tool_errors == ("exception", "exception")
    assert [m["content"] for m in reply.messages] == ["error: SystemExit: 3",
                                                      "error: Unprintable: (its message cannot be printed)"]


def test_tool_output_that_is_no_valid_unicode_is_escaped():
    (message,) = respond(Toolbox(), call("listing")).messages
    assert message["content"] == "ok.txt\nbad-\\udcff.txt"
    message["content"].encode("utf-8")  # the tokenizer can take it

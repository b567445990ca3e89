"""`agent`: rollouts run by an agent that owns its loop, talking to the policy through an OpenAI-compatible API.

    [[orchestrator.env]]
    id = "agent"
    args = { function = "my_pkg.agents:run", task = { id = "calculator" } }
    # or: args = { command = ["python", "agents/solve.py"], task = { id = "dataset", args = { path = "..." } } }

Each rollout gets a session of the orchestrator's gateway (docs/agents.md): a base URL and a key valid for that
rollout only. The agent is either

- `function`: an async function `run(client, example)` ('pkg.module:name'), handed an `openai.AsyncOpenAI` bound to
  the session (`client.base_url` and `client.api_key` serve any other SDK) and the `Example`; or
- `command`: a program run once per rollout (argv list; its first entry found on PATH or as a path), with
  `OPENAI_BASE_URL` and `OPENAI_API_KEY` set (and none of the run's own `PRIME_*` settings: the inference
  server's key is not its to use), the example as JSON on stdin ({"prompt", "answer", "info"}), in its own
  process group, which is killed when it ends or outlasts `timeout_s` (and, on Linux, the command itself when the
  orchestrator dies); the last 64 KiB of its stdout and stderr are kept.

Its reward: what the function returns, or the last line of the command's stdout as JSON: a number, a `Reward`
(function) or {"reward": number, "components": {name: number}} (command), or none (None, `null`, an empty
stdout): then the `task` environment's own reward scores the recorded conversation (`score_rollout` of the
messages after the prompt, the last one the policy's final reply), so every data source and reward function of
`dataset` (or any environment) works with agents. The `task` environment (a table: `id`, `args`) also gives the
examples. An agent that raises, exits non-zero, prints something else, never calls the model or outlasts
`timeout_s` fails its rollout under the environment's `on_error`. At most `max_concurrency` rollouts of this
environment run at once. Every sample of a rollout (a segment: docs/agents.md) gets the rollout's advantage;
`turn_discount` gamma < 1 gives the tokens of call j of its J calls gamma^(J - 1 - j) of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import math
import numbers
import os
import shutil
import signal
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from prime_rl.envs.environment import Environment, Example, Reward, Rollout, require
from prime_rl.envs.registry import load_env, register_env
from prime_rl.utils.errors import UserError
from prime_rl.utils.imports import import_object
from prime_rl.utils.process_groups import die_with_parent, signal_group

AGENT_REWARD = "agent_reward"
"""The `Rollout.state` key of the reward the agent returned (absent: the task scores the rollout)."""


def agent_reward(value: Any) -> Reward | None:
    """The reward an agent returned (module docstring) as a `Reward`, or None; ValueError naming what is wrong."""
    if value is None:
        return None
    if isinstance(value, Reward):
        return Reward(_number(value.total), {str(k): _number(v) for k, v in value.components.items()})
    if isinstance(value, dict):
        unknown = set(value) - {"reward", "components"}
        if unknown or "reward" not in value:
            raise ValueError(f"a reward object needs 'reward' (and optional 'components'), got keys {sorted(value)}")
        if value["reward"] is None:
            return None
        components = value.get("components") or {}
        if not isinstance(components, dict):
            raise ValueError(f"'components' must be an object of numbers, got {str(components)[:100]}")
        return Reward(_number(value["reward"]), {str(k): _number(v) for k, v in components.items()})
    return Reward(_number(value))


def _number(value: Any) -> float:
    """`value` as a float: any real number (numpy's too) but a bool, finite."""
    try:
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"a reward must be a finite number, got {str(value)[:100]}")
    return number


def example_json(example: Example) -> str:
    """The example as a command reads it on stdin (values JSON cannot hold are written as text)."""
    return json.dumps({"prompt": example.prompt, "answer": example.answer, "info": example.info}, default=str)


class FunctionAgent:
    """An async function `run(client, example)` named by import path (module docstring)."""

    def __init__(self, path: str):
        try:
            self.function = import_object(path)
        except ValueError as exc:
            raise UserError(f"environment 'agent': function {exc}") from None
        if not inspect.iscoroutinefunction(self.function):
            raise UserError(f"environment 'agent': function {path!r} must be an async function "
                            "(async def run(client, example)), or a blocking agent blocks every rollout")
        self.path = path

    async def run(self, base_url: str, api_key: str, example: Example, http_client: httpx.AsyncClient
                  ) -> Reward | None:
        """Run the function on an `openai` client of the session over `http_client`, the runner's (one for every
        rollout: a client of its own would cost each rollout a TLS context, ~30 ms of CPU)."""
        import openai  # the agents' client, imported when an agent first runs

        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)
        try:
            value = await self.function(client, example)  # not closed: that would close the shared http_client
        except SystemExit as exc:  # raised out of a task, it would stop the orchestrator's event loop
            raise RuntimeError(f"it called sys.exit({exc.code})") from None
        try:
            return agent_reward(value)
        except ValueError as exc:
            raise ValueError(f"{self.path} returned {exc}") from None


OUTPUT_TAIL_BYTES = 64 * 1024  # what is kept of a command's stdout and of its stderr (their ends)
HIDDEN_ENV_PREFIXES = ("PRIME_", "OPENAI_")  # the run's own settings (the inference server's key among them)


def command_env() -> dict[str, str]:
    """The orchestrator's environment without the run's own settings (`HIDDEN_ENV_PREFIXES`): a command reaches
    the policy through its session only."""
    return {k: v for k, v in os.environ.items() if not k.startswith(HIDDEN_ENV_PREFIXES)}


async def read_tail(stream: asyncio.StreamReader) -> bytes:
    """Everything `stream` gives until it closes, keeping the last `OUTPUT_TAIL_BYTES`."""
    tail = b""
    while chunk := await stream.read(1 << 16):
        tail = (tail + chunk)[-OUTPUT_TAIL_BYTES:]
    return tail


async def feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Write `data` to the process's stdin and close it (a command that never reads it is not waited for)."""
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(data)
        await process.stdin.drain()
        process.stdin.close()


class CommandAgent:
    """A program run once per rollout, in its own process group (module docstring)."""

    def __init__(self, argv: list[str]):
        if not (isinstance(argv, list) and argv and all(isinstance(part, str) for part in argv)):
            raise UserError(f"environment 'agent': command must be a non-empty list of strings (an argv, e.g. "
                            f"[\"python\", \"agent.py\"]), got {argv!r}")
        if shutil.which(argv[0]) is None:
            raise UserError(f"environment 'agent': command {argv[0]!r} not found (neither on PATH nor as a path "
                            "to an executable file)")
        script = argv[1] if len(argv) > 1 and os.path.basename(argv[0]).startswith("python") else ""
        if script.endswith(".py") and not os.path.isfile(script):
            raise UserError(f"environment 'agent': command's script {script!r} not found")
        self.argv = list(argv)

    async def run(self, base_url: str, api_key: str, example: Example, http_client: httpx.AsyncClient | None = None
                  ) -> Reward | None:
        env = {**command_env(), "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
        process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL))
        reading = asyncio.gather(read_tail(process.stdout), read_tail(process.stderr))
        try:
            await feed(process, example_json(example).encode())
            while process.returncode is None:  # not `wait()`: on 3.11 it also waits for every pipe to close,
                await asyncio.sleep(0.02)  # which a child the command left running may hold open
        finally:  # ended, timed out or cancelled: nothing of its group outlives the rollout, nor holds its pipes
            signal_group(process.pid, signal.SIGKILL)
            if process.returncode is None:
                await process.wait()
            out, err = await reading
        if process.returncode != 0:
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
            raise RuntimeError(f"command exited with code {process.returncode}: {last[0][:300]}")
        lines = out.decode(errors="replace").strip().splitlines()
        if not lines:
            return None
        try:
            return agent_reward(json.loads(lines[-1]))
        except ValueError as exc:
            raise ValueError(f"the command's last line of stdout is not a reward ({exc}): {lines[-1][:200]!r}"
                             ) from None


@register_env
class AgentEnvironment(Environment):
    id = "agent"
    rollout_kind = "agent"

    def __init__(self, task: dict | None = None, function: str = "", command: list | None = None,
                 timeout_s: float = 300.0, max_concurrency: int = 32, turn_discount: float = 1.0):
        require(bool(function) != bool(command), self.id, "set exactly one of function ('pkg.module:run') or "
                "command (a list of strings)")
        require(isinstance(task, dict) and isinstance(task.get("id"), str) and set(task) <= {"id", "args"}
                and isinstance(task.get("args", {}), dict), self.id,
                f"task must be a table {{ id = ..., args = {{...}} }} naming the environment whose examples and "
                f"reward the agent gets, got {task!r}")
        require(task["id"] != self.id, self.id, "task cannot itself be an agent environment")
        require(timeout_s > 0 and max_concurrency >= 1, self.id,
                f"need timeout_s > 0 and max_concurrency >= 1, got {timeout_s} and {max_concurrency}")
        require(0 < turn_discount <= 1, self.id, f"need 0 < turn_discount <= 1, got {turn_discount}")
        self.task = load_env(task["id"], **task.get("args", {}))
        self.program: FunctionAgent | CommandAgent = FunctionAgent(function) if function else CommandAgent(command)
        self.timeout_s = float(timeout_s)
        self.max_concurrency = max_concurrency
        self.turn_discount = float(turn_discount)

    def examples(self, seed: int = 0) -> Iterator[Example]:
        return self.task.examples(seed)

    def eval_examples(self, seed: int = 0) -> Iterator[Example]:
        return self.task.eval_examples(seed)

    def example_pool(self) -> Sequence[Example] | None:
        """Its task's pool (a curriculum weighs the task's examples)."""
        return self.task.example_pool()

    def demonstration(self, example: Example) -> list[dict[str, Any]]:
        return self.task.demonstration(example)

    async def score(self, example: Example, completion: str) -> Reward:
        return await self.task.score(example, completion)

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        """The agent's own reward, else the task's score of the recorded conversation."""
        reward = rollout.state.get(AGENT_REWARD)
        return reward if reward is not None else await self.task.score_rollout(example, rollout)

    async def score_group(self, example: Example, rollouts: list[Rollout]) -> list[Reward] | None:
        """The task's group scoring when no agent of the group returned a reward (else each alone)."""
        if any(r.state.get(AGENT_REWARD) is not None for r in rollouts):
            return None
        return await self.task.score_group(example, rollouts)

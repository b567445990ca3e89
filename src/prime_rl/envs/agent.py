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
  `OPENAI_BASE_URL` and `OPENAI_API_KEY` set, the example as JSON on stdin ({"prompt", "answer", "info"}), in its
  own process group, which is killed when it ends or outlasts `timeout_s` (and, on Linux, when the orchestrator
  dies).

Its reward: what the function returns, or the last line of the command's stdout as JSON: a number, a `Reward`
(function) or {"reward": number, "components": {name: number}} (command), or none (None, `null`, an empty
stdout): then the `task` environment's own reward scores the recorded conversation (`score_rollout` of the
messages after the prompt, the last one the policy's final reply), so every data source and reward function of
`dataset` (or any environment) works with agents. The `task` environment (a table: `id`, `args`) also gives the
examples. An agent that raises, exits non-zero, prints something else, never calls the model or outlasts
`timeout_s` fails its rollout under the environment's `on_error`. At most `max_concurrency` rollouts of this
environment run at once.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import shutil
import signal
from collections.abc import Iterator
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
    if value is None or isinstance(value, Reward):
        return value
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
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"a reward must be a finite number, got {str(value)[:100]}")
    return float(value)


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
        value = await self.function(client, example)  # not closed: that would close the shared http_client
        try:
            return agent_reward(value)
        except ValueError as exc:
            raise ValueError(f"{self.path} returned {exc}") from None


class CommandAgent:
    """A program run once per rollout, in its own process group (module docstring)."""

    def __init__(self, argv: list[str]):
        if not (argv and all(isinstance(part, str) for part in argv)):
            raise UserError(f"environment 'agent': command must be a non-empty list of strings, got {argv!r}")
        if shutil.which(argv[0]) is None:
            raise UserError(f"environment 'agent': command {argv[0]!r} not found (neither on PATH nor as a path "
                            "to an executable file)")
        self.argv = list(argv)

    async def run(self, base_url: str, api_key: str, example: Example, http_client: httpx.AsyncClient | None = None
                  ) -> Reward | None:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
        process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL))
        try:
            out, err = await process.communicate(example_json(example).encode())
        finally:  # ended, timed out or cancelled: nothing of its group outlives the rollout
            signal_group(process.pid, signal.SIGKILL)
            if process.returncode is None:
                await process.wait()
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

    def __init__(self, task: dict | None = None, function: str = "", command: list | None = None,
                 timeout_s: float = 300.0, max_concurrency: int = 32):
        require(bool(function) != bool(command), self.id, "set exactly one of function ('pkg.module:run') or "
                "command (a list of strings)")
        require(isinstance(task, dict) and isinstance(task.get("id"), str) and set(task) <= {"id", "args"}
                and isinstance(task.get("args", {}), dict), self.id,
                f"task must be a table {{ id = ..., args = {{...}} }} naming the environment whose examples and "
                f"reward the agent gets, got {task!r}")
        require(task["id"] != self.id, self.id, "task cannot itself be an agent environment")
        require(timeout_s > 0 and max_concurrency >= 1, self.id,
                f"need timeout_s > 0 and max_concurrency >= 1, got {timeout_s} and {max_concurrency}")
        self.task = load_env(task["id"], **task.get("args", {}))
        self.program: FunctionAgent | CommandAgent = FunctionAgent(function) if function else CommandAgent(command)
        self.timeout_s = float(timeout_s)
        self.max_concurrency = max_concurrency

    def examples(self, seed: int = 0) -> Iterator[Example]:
        return self.task.examples(seed)

    def eval_examples(self, seed: int = 0) -> Iterator[Example]:
        return self.task.eval_examples(seed)

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

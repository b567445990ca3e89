"""Adapter: a `verifiers` 0.4 taskset behind our `Environment` protocol, run by our own token-exact runner.

Used by `load_env` for an id that is not built in, when `verifiers` is installed (the
`verifiers` extra, verifiers 0.4.0).

What verifiers 0.4 is. The 0.2 classes (`SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, `Rubric`,
`verifiers.load_environment(id, **args)`) are gone: the package is `verifiers.v1`. An
environment id names an installed *taskset* package (dashes become underscores; it exports
one `vf.Taskset` subclass in `__all__`). The taskset yields `vf.Task`s: `TaskData` (`prompt`,
`system_prompt`, the row's own fields such as `answer`) plus behaviour: `@vf.reward`
(weighted) and `@vf.metric` methods scored on a finished `vf.Trace` by `Task.score(trace)`,
`@vf.stop` predicates, and `Task.toolsets(config)` / `Taskset.toolsets(config)`: `vf.Toolset`
tool servers whose `@vf.tool` methods are the model's tools (offered as `<server>_<tool>`,
or bare when `TOOL_PREFIX = None`). verifiers itself runs a rollout by launching a *harness*
program (a chat loop, a coding agent) in a runtime (subprocess, docker, ...), with the
taskset's tools served as MCP servers and every model call proxied through an interception
server to a `Client`; its `TrainClient` renders token ids with the `renderers` package and
calls prime's vLLM `/inference/v1/generate` endpoint.

Design: we map the taskset onto our protocol and let our conversation runner drive the
turns, instead of running verifiers' rollout against an OpenAI-compatible client of ours.
Running their rollout would mean, per rollout, a harness program bootstrapped with
`uv sync --script` (verifiers forces network for that), an interception server and MCP
server processes: network at run time (which this project forbids), seconds of start-up per
rollout on 2 cores, and a second renderer between the sampler and the trainer that we
would have to keep byte-identical with our chat template. Mapping gives the same
conversation the tool-less `null` chat harness runs (system prompt, the task's prompt, the
model's tool calls answered by tool messages until a turn calls no tool), token-exact by
construction: our runner sends the exact token ids, appends the sampled ids and the chat
template's rendering of each reply, so the trainer sees exactly the sampled tokens.

- Examples: the taskset's tasks in `load()` order, shuffled per pass with the seed;
  `answer` is the task data's `answer` field when it has one.
- A task without tools is a single-turn environment. A task with toolsets is a tool
  environment (`ToolEnvironment`: Hermes `<tool_call>` blocks in the assistant's text,
  each `@vf.tool` method called in-process with a timeout and an output cap, errors
  returned to the model as tool messages); the rollout also ends when a `@vf.stop`
  predicate over the trace says so.
- Scoring: the conversation becomes a `vf.Trace` (the prompt, each assistant turn with
  its text and its tool calls as structured `tool_calls`, the tool messages), `Task.score`
  runs the task's rewards and metrics; `Reward.total` is `trace.reward` (the weighted sum),
  the components are each reward's score and each metric.
- Adapter arguments (the TOML `args` with these names): `max_turns` (default 4),
  `tool_timeout_s` (5), `max_tool_output_chars` (2000); every other argument is a field
  of the taskset's config.

Refused with a one-line UserError naming the environment: a taskset that cannot be loaded
or has no tasks, an infinite taskset, a taskset that ships its own `Env` (multi-agent:
user simulation, best-of-n, judges) or its own `Harness`, tasks that need a container or
override `setup`/`finalize` (they run in a verifiers runtime), LLM judges, rewards that
need a runtime, `@vf.stop` predicates on a `Request`/`Response`, `@vf.intercept` hooks,
and toolsets that keep rollout state (a `State` subclass or `setup_task`). verifiers 0.4
has no group reward functions (cross-rollout judgement is a multi-agent `Env.finalize`),
so `score_group` keeps its default.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from prime_rl.chat.tool_calls import parse_tool_calls
from prime_rl.envs.environment import Environment, EnvReply, Example, Reward, Rollout
from prime_rl.envs.tools import ToolEnvironment
from prime_rl.utils.errors import UserError

TASK_KEY = "verifiers_task"  # Example.info key: the index of the task the example came from
ADAPTER_ARGS = ("max_turns", "tool_timeout_s", "max_tool_output_chars")
"""TOML `args` the adapter keeps for itself; the rest configure the taskset."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _overrides(obj: Any, base: type, name: str) -> bool:
    return getattr(type(obj), name) is not getattr(base, name)


def _needs_runtime(fn: Callable[..., Any]) -> bool:
    """Like `Task.score`: a hook with a `runtime` parameter without a default cannot run without a verifiers runtime."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def _tool_function(server: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """A `@vf.tool` method as a plain tool function named as verifiers offers it (`<server>_<tool>`)."""
    tool = getattr(method, "tool_name", None) or method.__name__
    name = f"{server.server_name}_{tool}" if server.server_name else tool
    if inspect.iscoroutinefunction(method):
        async def call(**kwargs: Any) -> Any:
            return await method(**kwargs)
    else:
        def call(**kwargs: Any) -> Any:
            return method(**kwargs)
    functools.update_wrapper(call, method)  # signature, annotations and docstring of the tool
    call.__name__ = call.__qualname__ = name
    return call


class _Taskset:
    """The examples and the scoring shared by both adapters (a mixin before the `Environment` base)."""

    id: str

    def _init_taskset(self, env_id: str, vf: Any, tasks: list[Any]) -> None:
        self.id, self.vf, self.tasks = env_id, vf, tasks
        self.stops = tasks[0].hooks("stop")

    def examples(self, seed: int = 0) -> Iterator[Example]:
        rng = random.Random(seed)
        order = list(range(len(self.tasks)))
        while True:
            rng.shuffle(order)
            for i in order:
                data = self.tasks[i].data
                yield Example(prompt=self._prompt(data), answer=str(getattr(data, "answer", "") or ""),
                              info={TASK_KEY: i})

    def _prompt(self, data: Any) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            return [*system, {"role": "user", "content": data.prompt}]
        return [*system, *(m.model_dump(exclude_none=True) for m in data.prompt or [])]

    def _trace(self, example: Example, messages: list[dict[str, Any]]) -> Any:
        """The conversation (prompt + `messages`) as a verifiers Trace: one node per message, assistant turns sampled,
        their `<tool_call>` blocks as structured `tool_calls`."""
        vf = self.vf
        from verifiers.v1.graph import MessageNode

        nodes = []
        for i, message in enumerate([*example.prompt, *messages]):
            role, content = message.get("role"), message.get("content") or ""
            if role == "assistant":
                turn = parse_tool_calls(str(content))
                calls = [vf.ToolCall(id=c.id, name=c.name, arguments=json.dumps(c.arguments)) for c in turn.calls]
                vf_message = vf.AssistantMessage(content=turn.content, tool_calls=calls or None)
            elif role == "tool":
                vf_message = vf.ToolMessage(tool_call_id=message.get("tool_call_id") or "", name=message.get("name"),
                                            content=content)
            elif role == "system":
                vf_message = vf.SystemMessage(content=content)
            else:
                vf_message = vf.UserMessage(content=content)
            nodes.append(MessageNode(message=vf_message, parent=i - 1 if i else None, sampled=role == "assistant"))
        task = self.tasks[example.info[TASK_KEY]]
        return vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                        agent=vf.AgentInfo(config=vf.AgentConfig()), nodes=nodes)

    async def score_rollout(self, example: Example, rollout: Rollout) -> Reward:
        """The task's rewards and metrics on the conversation: `trace.reward` (the weighted sum) is the total, each
        reward's score and each metric a component."""
        trace = self._trace(example, rollout.messages)
        await self.tasks[example.info[TASK_KEY]].score(trace)
        components = {name: r.score for name, r in trace.rewards.items() if r is not None}
        components.update({name: v for name, v in trace.metrics.items() if v is not None and name not in components})
        return Reward(total=float(trace.reward), components={k: float(v) for k, v in components.items()})

    async def score(self, example: Example, completion: str) -> Reward:
        """`score_rollout` of a conversation of one assistant turn."""
        return await self.score_rollout(example, Rollout([{"role": "assistant", "content": completion}]))


class VerifiersEnv(_Taskset, Environment):
    """A verifiers taskset without tools: one policy turn, scored by the task's rewards."""

    def __init__(self, env_id: str, vf: Any, tasks: list[Any]):
        self._init_taskset(env_id, vf, tasks)


class VerifiersToolEnv(_Taskset, ToolEnvironment):
    """A verifiers taskset with toolsets: the policy's `<tool_call>` blocks run the `@vf.tool` methods, until a turn
    calls no tool, a `@vf.stop` predicate fires or `max_turns`."""

    def __init__(self, env_id: str, vf: Any, tasks: list[Any], toolsets: list[Any], max_turns: int = 4,
                 tool_timeout_s: float = 5.0, max_tool_output_chars: int = 2000):
        self._init_taskset(env_id, vf, tasks)
        self.toolsets = toolsets
        self._ready: asyncio.Lock | None = None
        self._set_up = False
        try:
            super().__init__(max_turns, tool_timeout_s, max_tool_output_chars)
        except ValueError as exc:  # a tool function_schema cannot describe, or two tools with one name
            raise UserError(f"verifiers environment '{env_id}': {exc}") from None

    def tool_functions(self) -> list[Callable[..., Any]]:
        from verifiers.v1.utils.decorators import discover_decorated

        return [_tool_function(server, method)
                for server in self.toolsets for method in discover_decorated(server, "tool")]

    async def _setup_toolsets(self) -> None:
        """`Toolset.setup()` of every toolset, once, on the event loop that runs the rollouts."""
        if self._set_up:
            return
        self._ready = self._ready or asyncio.Lock()
        async with self._ready:
            if not self._set_up:
                for server in self.toolsets:
                    await server.setup()
                self._set_up = True

    async def respond(self, example: Example, messages: list[dict[str, Any]], state: dict[str, Any]) -> EnvReply:
        """Done when a `@vf.stop` predicate over the conversation fires; else the tool messages of the turn's calls
        (done when it made none)."""
        for stop in self.stops:
            fired = stop(self._trace(example, messages))
            if inspect.isawaitable(fired):
                fired = await fired
            if fired:
                state["stop_condition"] = stop.__name__
                return EnvReply(done=True)
        await self._setup_toolsets()
        return await super().respond(example, messages, state)


def _load_tasks(env_id: str, vf: Any, args: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The taskset's tasks and its toolsets (taskset-wide, then per-task), or a UserError saying why not."""
    from verifiers.v1.session import hook_boundary
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils.decorators import discover_decorated

    try:
        config = vf.taskset_config_type(env_id).model_validate({**args, "id": env_id})
        taskset = vf.load_taskset(config)
    except Exception as exc:  # verifiers raises what its module loader and pydantic raise
        raise UserError(f"cannot load verifiers environment '{env_id}' with args {args}: {_one_line(exc)}") from None
    if vf.environment_class(env_id) is not vf.SingleAgentEnv:
        raise UserError(f"verifiers environment '{env_id}' ships its own Env "
                        f"({vf.environment_class(env_id).__name__}): multi-agent envs cannot run in prime-rl")
    if vf.default_harness_id(env_id) == env_id:
        raise UserError(f"verifiers environment '{env_id}' ships its own Harness program, which prime-rl cannot run")
    if not taskset.bounded:
        raise UserError(f"verifiers environment '{env_id}' is an infinite taskset, which is not supported")
    try:
        tasks = list(taskset)
    except Exception as exc:
        raise UserError(f"verifiers environment '{env_id}': loading its tasks raised {_one_line(exc)}") from None
    if not tasks:
        raise UserError(f"verifiers environment '{env_id}' has no tasks")
    task, task_cls = tasks[0], type(tasks[0])
    problems = []
    if task_cls.NEEDS_CONTAINER or any(t.data.image for t in tasks):
        problems.append("its tasks need a container")
    problems += [f"its task overrides {hook}()" for hook in ("setup", "finalize") if _overrides(task, vf.Task, hook)]
    if task.config.judges:
        problems.append("its task has LLM judges")
    problems += [f"reward {fn.__name__} needs a runtime" for fn in task.hooks("reward") if _needs_runtime(fn)]
    if discover_decorated(task, "intercept"):
        problems.append("its task has @vf.intercept hooks")
    try:
        problems += [f"@vf.stop {fn.__name__} is on a {kind.__name__}" for fn in task.hooks("stop")
                     if (kind := hook_boundary(fn, allow_trace=True)) is not vf.Trace]
    except TypeError as exc:
        problems.append(str(exc))
    toolsets = [*type(taskset).toolsets(taskset.config), *task_cls.toolsets(task.config)]
    for server in toolsets:
        if state_cls(type(server)) is not vf.State or _overrides(server, vf.Toolset, "setup_task"):
            problems.append(f"toolset {type(server).__name__} keeps per-rollout state")
    if problems:
        raise UserError(f"verifiers environment '{env_id}' cannot run in prime-rl: {'; '.join(problems)}")
    return tasks, toolsets


def _verifiers_v1() -> Any:
    """The `verifiers.v1` module, or None when verifiers is not installed; a UserError for another verifiers."""
    try:
        import verifiers
    except ImportError:
        return None
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise UserError(f"verifiers {getattr(verifiers, '__version__', '?')} is installed, prime-rl needs verifiers "
                        "0.4 (the 'verifiers' extra)") from None
    return vf


def load_verifiers_env(env_id: str, args: dict[str, Any]) -> Environment | None:
    """The verifiers environment (taskset) `env_id`, or None when `verifiers` is not installed. `args` configure the
    taskset, except the adapter's own `max_turns`, `tool_timeout_s` and `max_tool_output_chars` (tool tasksets)."""
    vf = _verifiers_v1()
    if vf is None:
        return None
    own = {k: args[k] for k in ADAPTER_ARGS if k in args}
    tasks, toolsets = _load_tasks(env_id, vf, {k: v for k, v in args.items() if k not in own})
    if not toolsets:
        if own:
            raise UserError(f"verifiers environment '{env_id}' has no tools: arguments {', '.join(own)} do not apply")
        return VerifiersEnv(env_id, vf, tasks)
    return VerifiersToolEnv(env_id, vf, tasks, toolsets, **own)

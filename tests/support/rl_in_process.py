"""An `rl` run in the test's own process: the feature tests' harness.

`run_in_process(argv)` makes the plan `rl` makes (`prime_rl.launch.plan`: the same config loading, ports,
resume pinning, run-directory preparation and component configs) and carries it out here instead of with
processes: each builtin server (the policy's and a teacher's) serves in a thread, the orchestrator runs in a
thread, the trainer in another on its one-rank gloo group. It takes a second or two to start instead of the
three torch imports and model loads of a real `rl`, so a feature test pays only for its steps.

What stays with the launcher's own tests (`tests/launch/`): processes, supervision, kills and interrupts,
resumes after a crash, the progress display, exit codes, the API key that reaches the children through their
environment (here the servers require none), log files (here every component logs to the test's stderr) and
split or multi-rank trainers (`trainer.num_processes > 1` is refused here).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from prime_rl.configs.cli import build_config
from prime_rl.inference.backends import BuiltinServer, builtin_server
from prime_rl.inference.config import resolved_backend
from prime_rl.launch.plan import RunPlan, plan_run, prepare_run_dir
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.orchestrator import body as run_orchestrator
from prime_rl.trainer.rl.train import train
from prime_rl.utils.logging import LOG_FILE_BY_PARENT_ENV
from tests.support.rl_runs import check_on_policy, on_policy_args, rows_by_source

TIMEOUT_S = 300


@dataclass
class InProcessRun:
    """A finished in-process run: its plan and each server's last served weight step (by server name)."""

    plan: RunPlan
    served_steps: dict[str, int]

    @property
    def run_dir(self) -> Path:
        return self.plan.config.output_dir

    def rows(self, source: str) -> dict[int, dict]:
        """The last metrics.jsonl line of each step logged by `source` ("trainer" or "orchestrator")."""
        return rows_by_source(self.run_dir, source)


class _Worker(threading.Thread):
    """A daemon thread that keeps what its target raised."""

    def __init__(self, name: str, target: Callable[[], None]):
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except BaseException as exc:  # reported by the test's thread
            self.error = exc


def _start_server(server: BuiltinServer, name: str, timeout_s: float) -> _Worker:
    worker = _Worker(name, server.serve)
    worker.start()
    deadline = time.monotonic() + timeout_s
    while not server.http.started:
        if worker.error is not None or not worker.is_alive():
            raise AssertionError(f"{name} server failed to start: {worker.error!r}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} server did not start within {timeout_s:.0f}s")
        time.sleep(0.02)
    return worker


def run_in_process(argv: Sequence[str], timeout_s: float = TIMEOUT_S) -> InProcessRun:
    """Run `rl argv` in this process (module docstring); raises what a component raised, or AssertionError when
    the run does not finish within `timeout_s`."""
    config, _ = build_config(RLConfig, list(argv))
    if config.trainer.num_processes > 1 or config.deployment.split:
        raise ValueError("an in-process run has one trainer rank and every component: start `rl` for this")
    plan = plan_run(config)
    for server_config in (*plan.servers.values(), *plan.side.values()):
        if resolved_backend(server_config.backend) != "builtin":
            raise ValueError("an in-process run serves with the builtin backend")
    run_lock = prepare_run_dir(plan)
    saved_env = os.environ.get(LOG_FILE_BY_PARENT_ENV)
    os.environ[LOG_FILE_BY_PARENT_ENV] = "1"  # one process: logs go to stderr, not to one component's file
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    servers: dict[str, BuiltinServer] = {}
    workers: list[_Worker] = []
    judge_env = {k: v for k, v in plan.key_env.get("orchestrator", {}).items() if k.startswith("PRIME_JUDGE_")}
    try:
        os.environ.update(judge_env)  # the in-process orchestrator finds the judge rl serves as a child would
        for name, server_config in (*plan.servers.items(), *plan.side.items()):
            servers[name] = builtin_server(server_config)
            workers.append(_start_server(servers[name], name, timeout_s))
        components = [_Worker("trainer", lambda: train(plan.config.trainer)),
                      _Worker("orchestrator", lambda: run_orchestrator(plan.config.orchestrator))]
        for worker in components:
            worker.start()
        deadline = time.monotonic() + timeout_s
        while any(worker.is_alive() for worker in components):
            failed = [worker for worker in components if worker.error is not None]
            if failed:
                raise failed[0].error
            if time.monotonic() > deadline:
                raise AssertionError(f"the in-process run did not finish within {timeout_s:.0f}s")
            time.sleep(0.05)
        for worker in components:
            if worker.error is not None:
                raise worker.error
        return InProcessRun(plan, {name: server.engine.weight_step for name, server in servers.items()})
    finally:
        for key in judge_env:
            os.environ.pop(key, None)
        for server in servers.values():
            server.stop()
        for worker in workers:
            worker.join(timeout=30)
        run_lock.release()
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        if saved_env is None:
            os.environ.pop(LOG_FILE_BY_PARENT_ENV, None)
        else:
            os.environ[LOG_FILE_BY_PARENT_ENV] = saved_env


def on_policy_run(tmp_path: Path, env_table: str, seq_len: int, max_tokens: int,
                  model: str = "tiny-reverse-text", extra: Sequence[str] = (), exact: bool = True,
                  max_steps: int = 3, resume: bool = False) -> InProcessRun:
    """The on-policy test run of `rl_runs.on_policy_args` (with the `extra` command-line overrides) in this
    process, checked by `rl_runs.check_on_policy` (every step logged; mismatch KL < 1e-6 unless not `exact`)."""
    run = run_in_process([*on_policy_args(tmp_path, env_table, seq_len, max_tokens, model, max_steps, resume),
                          *extra])
    check_on_policy(run.run_dir, max_steps, exact)
    return run

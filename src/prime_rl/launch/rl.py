"""`rl`: one command for an RL run.

Resolves the composite config, decides the run (`launch/plan.py`: ports, devices, what a resume or
`--overwrite` changes), writes the component configs to `outputs/<run>/configs/`, starts the
inference server and the trainer (under torchrun when `trainer.num_processes > 1`), waits for the
server to serve, starts the orchestrator, shows progress, and stops everything when the run ends,
fails, or is interrupted.
With a `[teacher]` that names no `base_url` it also starts the teacher's inference server
(`configs/teacher.toml`, `logs/teacher.log`) beside the policy's and waits for it too; with a `[judge]`, the
judge's (`configs/judge.toml`, `logs/judge.log`).

A split run (`deployment.components`, one `rl` per node on a shared `output_dir`): a server node's
`rl` starts only the inference server, another `rl` the orchestrator and trainer. That one owns the
run directory (overwrite, resume clean-up, the marker, `configs/`, `logs/`) and waits for the remote
server's /health before starting the orchestrator; the server node's `rl` keeps its config and log
in `nodes/<hostname>/` (so they never make the directory look like an earlier run) and ends when
the trainer has logged its last step (read from the shared `metrics.jsonl`), or with Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from rich.console import Console

from prime_rl import run_lock
from prime_rl.configs.base import with_values
from prime_rl.configs.cli import run_main
from prime_rl.launch import slurm
from prime_rl.launch.plan import (
    JUDGE,
    RUN_PARTS,
    SIDE_SERVERS,
    TEACHER,
    is_server,
    plan_run,
    policy_servers,
    prepare_run_dir,
    starts_teacher,
)
from prime_rl.launch.processes import Child, stop_all
from prime_rl.launch.rl_config import RLConfig
from prime_rl.launch.server_restarts import BACKOFF_S, ServerRestarts
from prime_rl.run_dir import complete_steps, config_file, log_file, metrics_file, metrics_plot
from prime_rl.run_report import MetricsTail, ProgressView, summary_lines, write_plot
from prime_rl.utils.disk import describe, disk_state
from prime_rl.utils.errors import PrimeError
from prime_rl.utils.logging import LOG_FILE_BY_PARENT_ENV
from prime_rl.utils.net import server_root

POLL_S = 0.25
HEALTH_POLL_S = 0.1  # the orchestrator starts once the server answers: every 0.1 s waited delays the first step


class ComponentFailed(PrimeError):
    """A child process died; the message names it and shows its last log lines. `component`: which, `how`: how it
    stopped; `retryable`: whether running it again may help (not for a full disk, a user error, exit code 2, or a
    non-finite loss, exit code 3)."""

    def __init__(self, message: str, component: str = "", how: str = "", retryable: bool = False):
        super().__init__(message)
        self.component, self.how, self.retryable = component, how, retryable


def wait_for_health(url: str, child: Child | None, timeout_s: float, run_dir: Path) -> None:
    """Until `url` answers 200: `child` is the local server (its death is a failure), None for a remote one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and not child.running:
            raise failure(child, run_dir)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(HEALTH_POLL_S)
    where = f" (see {child.log_path})" if child is not None else " (deployment.startup_timeout_s)"
    raise ComponentFailed(f"inference server did not answer {url} within {timeout_s:.0f}s{where}")


def failure(child: Child, run_dir: Path, how: str | None = None) -> ComponentFailed:
    """Why `child` stopped (`how`, else its exit code): a full or read-only run directory in one line, else the end of
    its log."""
    code = child.poll()
    how = how or (f"exited with code {code}" if code is not None else "stopped")
    disk = disk_state(run_dir)
    if disk is not None:  # its own one-line error may not have reached the log on that disk
        return ComponentFailed(f"{child.name} {how}: {describe(disk, run_dir)}", child.name, how)
    lines = "\n".join(f"  {line}" for line in child.last_lines())
    return ComponentFailed(f"{child.name} {how}; last lines of {child.log_path}:\n{lines}", child.name, how,
                           retryable=code not in (2, 3))  # a user error; non-finite numbers (they would repeat)


def trainer_rendezvous(config: RLConfig) -> list[str]:
    """torchrun's arguments for a trainer across `deployment.trainer_nodes` nodes (c10d rendezvous), the same on
    every trainer node."""
    deployment = config.deployment
    return ["-m", "torch.distributed.run", f"--nnodes={deployment.trainer_nodes}",
            f"--nproc-per-node={config.trainer.num_processes}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={deployment.rdzv_endpoint}", "--rdzv-id=prime-rl-trainer"]


def component_commands(config: RLConfig, base: Path | None = None) -> dict[str, list[str]]:
    """Each component's command line, reading its config from `<base>/configs/<component>.toml` (base: the output
    dir, or a server node's `nodes/<hostname>/`; the teacher's server too when rl starts it), for the components
    this rl starts (`deployment.components`)."""
    python = sys.executable
    out = base if base is not None else config.output_dir
    trainer_module = ["-m", "prime_rl.trainer.rl.train", "@", str(config_file(out, "trainer"))]
    deployment = config.deployment
    if deployment.trainer_nodes > 1:  # the other nodes join the rendezvous themselves (`trainer_node_command`)
        trainer = [python, *trainer_rendezvous(config), *trainer_module]
    elif config.trainer.num_processes > 1:
        trainer = [python, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={config.trainer.num_processes}", *trainer_module]
    else:
        trainer = [python, *trainer_module]
    commands = {
        name: [python, "-m", "prime_rl.inference.server", "@", str(config_file(out, name))]
        for name in [*policy_servers(config), *([TEACHER] if starts_teacher(config) else []),
                     *([JUDGE] if config.judge is not None else [])]
    }
    commands["orchestrator"] = [python, "-m", "prime_rl.orchestrator.orchestrator", "@",
                                str(config_file(out, "orchestrator"))]
    commands["trainer"] = trainer
    here = config.deployment.components
    return {name: command for name, command in commands.items()
            if name in here or (is_server(name) and "inference" in here)}


def child_env(cuda_devices: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # PRIME_* variables were already applied to the resolved configs; children must not re-apply them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env.update({"CUDA_VISIBLE_DEVICES": cuda_devices, "PYTHONUNBUFFERED": "1", LOG_FILE_BY_PARENT_ENV: "1",
                run_lock.HELD_BY_PARENT_ENV: f"rl (pid {os.getpid()})"})
    env.update(extra or {})
    return env


def resume_hint(config: RLConfig) -> str:
    """What an interrupted run can be continued from, as the command line to add: the newest complete checkpoint,
    or, where none was written, how to rerun (and how to make the next run resumable)."""
    saved = complete_steps(config.output_dir, RUN_PARTS)
    if saved:
        return (f"Continue with --ckpt.resume-step latest (checkpoint step {saved[-1]} of {config.output_dir}; "
                f"what was trained after it is run again)")
    interval = config.ckpt.interval
    when = "only at the end" if interval is None else f"the first after step {interval}"
    return (f"No checkpoint was written (ckpt.interval = {interval}: {when}), so nothing can be resumed: "
            f"run again with --overwrite (and --ckpt.interval N to checkpoint every N steps)")


def _interrupt(signum, frame) -> None:
    """SIGTERM (a job scheduler, `kill`) stops the run the way Ctrl-C does."""
    raise KeyboardInterrupt


def spare_server(children: dict[str, Child], dead: Child, reported: set[str]) -> bool:
    """Whether the run can go on without the policy server `dead` (another is running: the orchestrator drops the
    dead one with a warning); says so once (`reported`: the names already said)."""
    others = [c for name, c in children.items() if name.startswith("inference") and c is not dead and c.running]
    if others and dead.name not in reported:
        print(f"rl: warning: inference server {dead.name} exited ({dead.poll()}); {len(others)} left (see "
              f"{dead.log_path})", file=sys.stderr)
        reported.add(dead.name)
    return bool(others)


def supervise(children: dict[str, Child], view: ProgressView, tail: MetricsTail, run_dir: Path,
              max_steps: int, restarts: ServerRestarts) -> None:
    """Poll until the trainer and orchestrator here finish (a server-only rl of a split run: until the trainer
    elsewhere has logged step max_steps - 1), restarting the servers that die or hang (`restarts`); raise on the
    first failure."""
    workers = [children[name] for name in ("trainer", "orchestrator") if name in children]
    reported: set[str] = set()
    while True:
        tail.poll()
        view.update(tail)
        for child in children.values():
            if is_server(child.name):
                why = restarts.check(child.name)
                if why is None or child.name.startswith("inference") and spare_server(children, child, reported):
                    continue
                raise failure(child, run_dir, why)
            if child.poll() not in (None, 0):
                raise failure(child, run_dir)
        if workers and all(child.poll() == 0 for child in workers):
            return
        trained = tail.last("trainer", "perf/step_time_s")
        if not workers and trained is not None and trained[0] + 1 >= max_steps:
            return
        time.sleep(POLL_S)


def launch(config: RLConfig) -> None:
    console = Console(stderr=False, soft_wrap=True)  # a line is a line in logs and CI too, never wrapped at 80
    if config.slurm is not None:  # write the job script, run nothing
        script = slurm.write_script(config)
        console.print(f"wrote {script} ({config.slurm.nodes} node(s)); submit it with: sbatch {script}")
        return
    start = time.monotonic()
    deaths: dict[str, deque[float]] = {}
    while True:
        try:
            config, tail, owner = run_once(config, console)
            break
        except ComponentFailed as failed:
            config = run_again(config, failed, deaths)

    if not owner:  # the trainer node's rl writes the plot and the summary
        console.print("the trainer logged its last step: the server node is done")
        return
    tail.poll()
    plot = write_plot(tail, metrics_plot(config.output_dir))
    for line in summary_lines(tail, time.monotonic() - start, config.output_dir):
        console.print(line)
    if plot is not None:
        console.print(f"plot: {plot}")


def run_again(config: RLConfig, failed: ComponentFailed, deaths: dict[str, deque[float]]) -> RLConfig:
    """After the trainer or the orchestrator died: the config that runs the whole run again from its newest complete
    checkpoint (`ckpt.resume_step` latest), returned after a back-off of 2^(k-1) s for the k-th time within
    `deployment.restart_window_s` (`deaths`: when each component died before). `failed` is raised instead when that
    cannot help: another component, no restarts left (`deployment.max_restarts`), nothing to resume from, a full
    disk or a user error."""
    rule, name = config.deployment, failed.component
    whole = {"trainer", "orchestrator"} <= set(rule.components)  # a split run's other half would not follow
    if name not in ("trainer", "orchestrator") or not whole or not failed.retryable or rule.max_restarts == 0:
        raise failed
    now = time.monotonic()
    times = deaths.setdefault(name, deque())
    while times and times[0] < now - rule.restart_window_s:
        times.popleft()
    saved = complete_steps(config.output_dir, RUN_PARTS)
    if len(times) >= rule.max_restarts or not saved:
        why = "no complete checkpoint to run again from" if not saved else \
            f"{len(times)} restart(s) within {rule.restart_window_s:g}s (deployment.max_restarts = {rule.max_restarts})"
        _, _, log_tail = str(failed).partition("; ")
        raise ComponentFailed(f"{name} {failed.how}, not run again ({why}); {log_tail}", name, failed.how)
    delay = BACKOFF_S * 2 ** len(times)
    times.append(now)
    print(f"rl: warning: {name} {failed.how}; running the run again from checkpoint step {saved[-1]} in {delay:g}s "
          f"(restart {len(times)} of {rule.max_restarts} within {rule.restart_window_s:g}s; see "
          f"{log_file(config.output_dir, name)})", file=sys.stderr, flush=True)
    try:
        time.sleep(delay)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM while nothing runs: the run stops as it would mid-run
        Console(stderr=False, soft_wrap=True).print(f"interrupted; all components stopped. {resume_hint(config)}")
        raise SystemExit(130) from None
    return with_values(config, {"ckpt.resume_step": "latest", "overwrite": False})


def run_once(config: RLConfig, console: Console) -> tuple[RLConfig, MetricsTail, bool]:
    """One start of the run's processes until they finish (the planned config, the metrics read, whether this rl
    owns the run); raises ComponentFailed when one fails, SystemExit(130) when interrupted."""
    plan = plan_run(config)  # every check first (the config's own ran at load time)
    run_lock = prepare_run_dir(plan)  # only then change the run directory (locked while this rl runs)
    config, base, owner, resumed = plan.config, plan.base, plan.owner, plan.resumed
    commands = component_commands(config, base)
    children = {
        name: Child(name, commands[name], log_file(base, name),
                    child_env(plan.devices[name],
                              plan.key_env.get(name, plan.key_env["inference"] if is_server(name) else None)),
                    gated=name == "orchestrator")
        for name in commands
    }
    signal.signal(signal.SIGTERM, _interrupt)

    # A server node reads the trainer's progress from the shared file: only what this run writes from now on.
    tail = MetricsTail(metrics_file(config.output_dir), since=0.0 if owner else time.time())
    view = restarts = None
    interrupted = False
    try:
        console.print(f"[bold]rl[/]: outputs in {config.output_dir}, logs in {log_file(base, 'rl').parent}")
        if resumed is not None:
            console.print(f"resuming after step {resumed} (checkpoints/step_{resumed})")
        # The trainer needs nothing from the server: it starts (imports, loads the model) meanwhile. So does the
        # orchestrator, up to its gate (utils.start_gate): it connects once every server answers.
        for name in (*plan.servers, *SIDE_SERVERS, "trainer", "orchestrator"):
            if name in children:
                children[name].start()
        waits = [(name, f"http://{server.host}:{server.port}/health", children[name])
                 for name, server in (*plan.servers.items(), *plan.side.items()) if name in children]
        if "orchestrator" in children and "inference" not in children:  # a split run: the server runs elsewhere
            waits += [("inference", f"{server_root(url)}/health", None) for url in config.orchestrator.client.urls]
        for name, health, child in waits:
            console.print(f"waiting for the {name} server ({health}) ...")
            wait_for_health(health, child, config.deployment.startup_timeout_s, config.output_dir)
        if "orchestrator" in children:
            children["orchestrator"].open_gate()
        if not owner and "orchestrator" not in children:
            console.print(f"serving at http://{config.inference.host}:{config.inference.port}/v1 until the trainer "
                          "elsewhere logs its last step (Ctrl-C stops it sooner)")
        view = ProgressView(console, config.max_steps, resumed or 0, config.output_dir,
                            config.orchestrator.samples.console_rows)
        nccl = config.weight_transfer.mode == "distributed"  # a new server cannot join the trainer's group
        restarts = ServerRestarts({name: (child, health) for name, health, child in waits if child is not None},
                                  config.deployment, fixed=policy_servers(config) if nccl else ())
        supervise(children, view, tail, config.output_dir, config.max_steps, restarts)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if restarts is not None:
            restarts.close()
        if view is not None:
            view.close()
        stop_all(list(children.values()))
        if run_lock is not None:
            run_lock.release()
    if interrupted:
        # A fresh console: Ctrl-C can land inside the old one's print of a step line, and rich then holds every
        # later print in its buffer (seen in CI: exit 130 and no hint in the log).
        Console(stderr=False, soft_wrap=True).print(f"interrupted; all components stopped. {resume_hint(config)}")
        sys.stdout.flush()
        raise SystemExit(130)
    return config, tail, owner


def main(argv: list[str] | None = None) -> None:
    run_main(RLConfig, launch, argv)


if __name__ == "__main__":
    main()

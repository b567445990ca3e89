"""`rl`: one command for an RL run.

Resolves the composite config, writes the three component configs to
`outputs/<run>/configs/`, starts the inference server, waits for it to serve, starts the
orchestrator and the trainer (under torchrun when `trainer.num_processes > 1`), shows
progress, and stops everything when the run ends, fails, or is interrupted.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prime_rl.configs.cli import run_main
from prime_rl.configs.rl import RLConfig
from prime_rl.configs.toml_io import write_toml
from prime_rl.launch.processes import Child, stop_all
from prime_rl.launch.report import MetricsTail, summary_lines, write_plot
from prime_rl.monitor.monitor import METRICS_FILE
from prime_rl.monitor.sinks import drop_steps_from
from prime_rl.run_dir import remove_temporaries, resolve_resume_step
from prime_rl.utils.errors import ConfigError, PrimeError
from prime_rl.utils.fs import remove_steps_from
from prime_rl.utils.logging import LOG_FILE_BY_PARENT_ENV

RUN_ARTIFACTS = ("rollouts", "weights", "checkpoints", "logs", "configs", "wandb", "metrics.jsonl", "metrics.jsonl.lock",
                 "metrics.png")
POLL_S = 0.25


class ComponentFailed(PrimeError):
    """A child process died; the message names it and shows its last log lines."""


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def prepare_output_dir(config: RLConfig) -> None:
    """An existing run is continued (resume), replaced (`--overwrite`), or an error."""
    out = config.output_dir
    existing = [name for name in RUN_ARTIFACTS if (out / name).exists()]
    if not existing or config.ckpt.resume_step is not None:
        return
    if not config.overwrite:
        raise ConfigError(
            f"output dir {out} already holds a run ({', '.join(existing)}); continue it with "
            "--ckpt.resume-step latest, replace it with --overwrite, or pick another --output-dir"
        )
    for name in existing:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def resume_from(config: RLConfig) -> int | None:
    """Pin `ckpt.resume_step` to one complete (trainer + orchestrator) checkpoint step N.

    'latest' becomes the newest complete step (`run_dir.resolve_resume_step`). What the
    interrupted run made after N goes, so the resumed processes regenerate it instead of
    mixing two runs: rollout batches >= N, weights > N, and the metrics.jsonl lines of
    steps >= N (the progress bar then starts at N). Temporaries of interrupted writes go too.
    """
    wanted = config.ckpt.resume_step
    if wanted is None:
        return None
    wanted = resolve_resume_step(config.output_dir, wanted)
    for component in (config, config.trainer, config.orchestrator):
        object.__setattr__(component.ckpt, "resume_step", wanted)
    remove_temporaries(config.output_dir)
    remove_steps_from(config.output_dir / "rollouts", wanted)
    remove_steps_from(config.output_dir / "weights", wanted + 1)
    drop_steps_from(config.output_dir / METRICS_FILE, wanted, ("trainer", "orchestrator"))
    return wanted


def assign_devices(config: RLConfig) -> tuple[str, str]:
    """CUDA_VISIBLE_DEVICES for inference and trainer ('' on a machine without GPUs)."""
    import torch

    count = torch.cuda.device_count()
    deployment = config.deployment
    if count == 0:
        if deployment.inference_gpu_ids or deployment.trainer_gpu_ids:
            raise ConfigError("deployment GPU ids are set but no CUDA device is visible")
        return "", ""
    for ids in (deployment.inference_gpu_ids, deployment.trainer_gpu_ids):
        bad = [i for i in ids if not 0 <= i < count]
        if bad:
            raise ConfigError(f"deployment GPU ids {bad} do not exist (this machine has {count} GPU(s))")
    inference = deployment.inference_gpu_ids or [0]
    trainer = deployment.trainer_gpu_ids or ([max(inference) + 1] if max(inference) + 1 < count else inference)
    if config.trainer.num_processes > len(trainer):
        raise ConfigError(
            f"trainer.num_processes = {config.trainer.num_processes} needs as many trainer GPUs, "
            f"got deployment.trainer_gpu_ids = {trainer}"
        )
    return ",".join(map(str, inference)), ",".join(map(str, trainer))


def wait_for_health(url: str, child: Child, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.running:
            raise failure(child)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    raise ComponentFailed(f"inference server did not answer {url} within {timeout_s:.0f}s (see {child.log_path})")


def failure(child: Child) -> ComponentFailed:
    code = child.poll()
    lines = "\n".join(f"  {line}" for line in child.last_lines())
    how = f"exited with code {code}" if code is not None else "stopped"
    return ComponentFailed(f"{child.name} {how}; last lines of {child.log_path}:\n{lines}")


def component_commands(config: RLConfig, config_dir: Path) -> dict[str, list[str]]:
    python = sys.executable
    trainer_module = ["-m", "prime_rl.trainer.rl.train", "@", str(config_dir / "trainer.toml")]
    if config.trainer.num_processes > 1:
        trainer = [python, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={config.trainer.num_processes}", *trainer_module]
    else:
        trainer = [python, *trainer_module]
    return {
        "inference": [python, "-m", "prime_rl.inference.server", "@", str(config_dir / "inference.toml")],
        "orchestrator": [python, "-m", "prime_rl.orchestrator.orchestrator", "@", str(config_dir / "orchestrator.toml")],
        "trainer": trainer,
    }


def child_env(cuda_devices: str) -> dict[str, str]:
    # PRIME_* variables were already applied to the resolved configs; children must not re-apply them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env.update({"CUDA_VISIBLE_DEVICES": cuda_devices, "PYTHONUNBUFFERED": "1", LOG_FILE_BY_PARENT_ENV: "1"})
    return env


def _interrupt(signum, frame) -> None:
    """SIGTERM (a job scheduler, `kill`) stops the run the way Ctrl-C does."""
    raise KeyboardInterrupt


class ProgressView:
    """A live bar on a terminal; one line per trained step otherwise (logs, CI)."""

    def __init__(self, console: Console, total: int, start: int = 0):
        self.console = console
        self.total = total
        self.shown_step = start  # a resumed run starts at its checkpoint step
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]rl"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), console=console,
            )
            self.task = self.bar.add_task("steps", total=total, completed=start, info="starting")
            self.bar.start()

    def update(self, tail: MetricsTail) -> None:
        trained = tail.last("trainer", "perf/step_time_s")
        if trained is None or trained[0] + 1 <= self.shown_step:
            return
        step, step_time = trained
        self.shown_step = step + 1
        reward = tail.get("orchestrator", "reward/mean").get(step)  # of the batch just trained on
        info = f"reward {reward:.3f}  " if reward is not None else ""
        info += f"step time {step_time:.1f}s"
        if self.bar is not None:
            self.bar.update(self.task, completed=self.shown_step, info=info)
        else:
            self.console.print(f"step {self.shown_step}/{self.total}  {info}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def supervise(children: dict[str, Child], view: ProgressView, tail: MetricsTail) -> None:
    """Poll until trainer and orchestrator finish; raise on the first failure."""
    while True:
        tail.poll()
        view.update(tail)
        for child in children.values():
            code = child.poll()
            if code not in (None, 0) or (child.name == "inference" and code is not None):
                raise failure(child)
        if children["trainer"].poll() == 0 and children["orchestrator"].poll() == 0:
            return
        time.sleep(POLL_S)


def launch(config: RLConfig) -> None:
    console = Console(stderr=False)
    start = time.monotonic()
    config.model.path  # noqa: B018 -- a missing local model is an input error: report it before creating anything
    prepare_output_dir(config)
    resumed = resume_from(config)
    inference_devices, trainer_devices = assign_devices(config)

    if "port" not in config.inference.model_fields_set:
        config.inference.port = free_port(config.inference.host)
    config.orchestrator.client.base_url = f"http://{config.inference.host}:{config.inference.port}/v1"
    config.orchestrator.trainer_world_size = config.trainer.num_processes

    config_dir = config.output_dir / "configs"
    for name in ("inference", "orchestrator", "trainer"):
        write_toml(config_dir / f"{name}.toml", getattr(config, name).model_dump(mode="json"))
    write_toml(config_dir / "rl.toml", config.model_dump(mode="json"))

    logs = config.output_dir / "logs"
    commands = component_commands(config, config_dir)
    devices = {"inference": inference_devices, "orchestrator": "", "trainer": trainer_devices}
    children = {
        name: Child(name, commands[name], logs / f"{name}.log", child_env(devices[name])) for name in commands
    }
    signal.signal(signal.SIGTERM, _interrupt)

    tail = MetricsTail(config.output_dir / "metrics.jsonl")
    view = None
    interrupted = False
    try:
        console.print(f"[bold]rl[/]: outputs in {config.output_dir}, logs in {logs}")
        if resumed is not None:
            console.print(f"resuming after step {resumed} (checkpoints/step_{resumed})")
        children["inference"].start()
        health = f"http://{config.inference.host}:{config.inference.port}/health"
        console.print(f"waiting for the inference server ({health}) ...")
        wait_for_health(health, children["inference"], config.deployment.startup_timeout_s)
        children["orchestrator"].start()
        children["trainer"].start()
        view = ProgressView(console, config.max_steps, resumed or 0)
        supervise(children, view, tail)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if view is not None:
            view.close()
        stop_all(list(children.values()))
    if interrupted:
        console.print(f"interrupted; all components stopped. Continue with --ckpt.resume-step latest "
                      f"(output dir {config.output_dir})")
        raise SystemExit(130)

    tail.poll()
    plot = write_plot(tail, config.output_dir / "metrics.png")
    for line in summary_lines(tail, time.monotonic() - start, config.output_dir):
        console.print(line)
    if plot is not None:
        console.print(f"plot: {plot}")


def main(argv: list[str] | None = None) -> None:
    run_main(RLConfig, launch, argv)


if __name__ == "__main__":
    main()

"""`rl`: one command for an RL run.

Resolves the composite config, writes the three component configs to
`outputs/<run>/configs/`, starts the inference server and the trainer (under torchrun
when `trainer.num_processes > 1`), waits for the server to serve, starts the
orchestrator, shows progress, and stops everything when the run ends, fails, or is interrupted.
With a `[teacher]` that names no `base_url` it also starts the teacher's inference server
(`configs/teacher.toml`, `logs/teacher.log`) beside the policy's and waits for it too.

A split run (`deployment.components`, one `rl` per node on a shared `output_dir`): a server node's
`rl` starts only the inference server, another `rl` the orchestrator and trainer. That one owns the
run directory (overwrite, resume clean-up, the marker, `configs/`, `logs/`) and waits for the remote
server's /health before starting the orchestrator; the server node's `rl` keeps its config and log
in `nodes/<hostname>/` (so they never make the directory look like an earlier run) and ends when
the trainer has logged its last step (read from the shared `metrics.jsonl`), or with Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import os
import secrets
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
from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.configs.toml_io import write_toml
from prime_rl.inference.config import InferenceConfig, resolved_backend
from prime_rl.launch import output_dir, slurm
from prime_rl.launch.processes import Child, stop_all
from prime_rl.launch.report import MetricsTail, summary_lines, write_plot
from prime_rl.launch.rl_config import COMPONENTS, RLConfig
from prime_rl.monitor.sinks import drop_steps_from
from prime_rl.run_dir import (
    ORCHESTRATOR,
    TRAINER,
    config_file,
    discard_after,
    log_file,
    metrics_file,
    metrics_plot,
    node_dir,
    remove_temporaries,
    resolve_resume_step,
    weights_root,
)
from prime_rl.utils.disk import describe, disk_state
from prime_rl.utils.errors import ConfigError, PrimeError
from prime_rl.utils.logging import LOG_FILE_BY_PARENT_ENV
from prime_rl.utils.net import listening_socket, server_root

POLL_S = 0.25
RUN_PARTS = (TRAINER, ORCHESTRATOR)  # what a checkpoint step of an rl run must hold to resume from
TEACHER = "teacher"  # the teacher's server: its config and log file names
SERVERS = ("inference", TEACHER)  # children that must never exit while the run goes on (one policy server of
# several, `inference_<i>`, may: the orchestrator drops it)


class ComponentFailed(PrimeError):
    """A child process died; the message names it and shows its last log lines."""


def server_port(host: str, port: int) -> int:
    """Bind `host`:`port` once (0: any free port) and return the port: a host that is no local
    address, or a port in use, is a one-line ConfigError before anything is started or deleted."""
    try:
        with listening_socket(host, port) as sock:  # as the server binds it
            return sock.getsockname()[1]
    except OSError as exc:  # socket.gaierror included
        where = f"inference.host {host!r}" if port == 0 else f"inference.port {port} on {host!r}"
        raise ConfigError(f"{where}: cannot listen there ({exc.strerror or exc})") from None


def prepare_output_dir(config: RLConfig) -> list[Path]:
    """Check the output dir (`launch/output_dir.py`): what `--overwrite` will delete. Deletes nothing itself."""
    return output_dir.plan(config.output_dir, config.overwrite, config.ckpt.resume_step is not None)


def pin_resume_step(config: RLConfig) -> int | None:
    """Pin `ckpt.resume_step` of the run and its components to one complete (trainer + orchestrator)
    checkpoint step N: 'latest' becomes the newest (`run_dir.resolve_resume_step`). Changes no file."""
    wanted = config.ckpt.resume_step
    if wanted is None:
        return None
    wanted = resolve_resume_step(config.output_dir, wanted, RUN_PARTS)
    for component in (config, config.trainer, config.orchestrator):
        object.__setattr__(component.ckpt, "resume_step", wanted)
    return wanted


def clear_after(config: RLConfig, step: int) -> None:
    """What the interrupted run made after checkpoint `step` goes, so the resumed processes regenerate it
    instead of mixing two runs: rollout batches >= step, weights > step, and the metrics.jsonl lines of
    steps >= step (the progress bar then starts there). Temporaries of interrupted writes go too."""
    remove_temporaries(config.output_dir)
    discard_after(config.output_dir, step)
    drop_steps_from(metrics_file(config.output_dir), step, ("trainer", "orchestrator"))


def assign_devices(config: RLConfig) -> tuple[str, str]:
    """CUDA_VISIBLE_DEVICES for inference and trainer ('' on a machine without GPUs)."""
    import torch

    count = torch.cuda.device_count()
    deployment = config.deployment
    here = deployment.components  # a split run's node checks only what it starts
    wanted = [ids for ids, name in ((deployment.inference_gpu_ids, "inference"), (deployment.trainer_gpu_ids, "trainer"))
              if name in here]
    if count == 0:
        if any(wanted):
            raise ConfigError("deployment GPU ids are set but no CUDA device is visible")
        return "", ""
    for ids in wanted:
        bad = [i for i in ids if not 0 <= i < count]
        if bad:
            raise ConfigError(f"deployment GPU ids {bad} do not exist (this machine has {count} GPU(s))")
    inference = deployment.inference_gpu_ids or [0]
    trainer = deployment.trainer_gpu_ids or ([max(inference) + 1] if max(inference) + 1 < count else inference)
    if not deployment.trainer_gpu_ids and "inference" not in deployment.components:  # a trainer node: every GPU
        trainer = list(range(count))
    if "trainer" in here and config.trainer.num_processes > len(trainer):
        raise ConfigError(
            f"trainer.num_processes = {config.trainer.num_processes} needs as many trainer GPUs, "
            f"got deployment.trainer_gpu_ids = {trainer}"
        )
    return ",".join(map(str, inference)), ",".join(map(str, trainer))


def match_inference_dtype(config: RLConfig, trainer_on_gpu: bool) -> None:
    """The inference servers compute in the trainer's compute dtype unless set: bfloat16 where the trainer runs
    on GPUs in bf16 mixed precision (`runtime.dtype` auto or bfloat16), float32 otherwise, so that on-policy
    logprobs agree (ratio 1 at max_async_level 0) on GPU as on CPU."""
    bf16 = trainer_on_gpu and config.trainer.runtime.dtype in ("auto", "bfloat16")
    dtype = "bfloat16" if bf16 else "float32"
    if "dtype" not in config.inference.builtin.model_fields_set:
        config.inference.builtin.dtype = dtype
    if "dtype" not in config.inference.vllm.model_fields_set:
        config.inference.vllm.dtype = dtype


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
        time.sleep(0.5)
    where = f" (see {child.log_path})" if child is not None else " (deployment.startup_timeout_s)"
    raise ComponentFailed(f"inference server did not answer {url} within {timeout_s:.0f}s{where}")


def failure(child: Child, run_dir: Path) -> ComponentFailed:
    """Why `child` stopped: a full or read-only run directory in one line, else the end of its log."""
    code = child.poll()
    how = f"exited with code {code}" if code is not None else "stopped"
    disk = disk_state(run_dir)
    if disk is not None:  # its own one-line error may not have reached the log on that disk
        return ComponentFailed(f"{child.name} {how}: {describe(disk, run_dir)}")
    lines = "\n".join(f"  {line}" for line in child.last_lines())
    return ComponentFailed(f"{child.name} {how}; last lines of {child.log_path}:\n{lines}")


def starts_teacher(config: RLConfig) -> bool:
    """Whether rl starts the teacher's server: a `[teacher]` without `base_url`."""
    return config.teacher is not None and config.teacher.base_url is None


def teacher_server(config: RLConfig, port: int) -> InferenceConfig:
    """The teacher server's config: inference's, with the teacher's model and backend, its own port, no weight
    updates (none from directories, none over the transfer group), one server, and one token more context than
    seq_len (a scoring request generates one)."""
    teacher = config.teacher
    vllm = config.inference.vllm.model_copy(update={"max_model_len": None, "max_lora_rank": None})
    return config.inference.model_copy(deep=True, update={
        "model": teacher.model, "backend": teacher.backend, "port": port, "seq_len": config.seq_len + 1,
        "weight_dirs": [], "vllm": vllm, "weight_transfer": WeightTransferConfig(), "num_servers": 1})


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
        for name in [*policy_servers(config), *([TEACHER] if starts_teacher(config) else [])]
    }
    commands["orchestrator"] = [python, "-m", "prime_rl.orchestrator.orchestrator", "@",
                                str(config_file(out, "orchestrator"))]
    commands["trainer"] = trainer
    here = config.deployment.components
    return {name: command for name, command in commands.items()
            if name in here or (is_server(name) and "inference" in here)}


def split_devices(devices: str, count: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each of `count` policy servers: `devices` (e.g. "0,1,2,3") in equal consecutive
    shares; on CPU ("") every server gets ""."""
    ids = [d for d in devices.split(",") if d]
    if not ids:
        return [""] * count
    if len(ids) % count:
        raise ConfigError(f"inference.num_servers = {count} does not divide the {len(ids)} inference GPU(s) "
                          f"({devices}): give each server as many (deployment.inference_gpu_ids)")
    share = len(ids) // count
    return [",".join(ids[i * share:(i + 1) * share]) for i in range(count)]


def policy_servers(config: RLConfig) -> list[str]:
    """The policy's servers: `inference`, then `inference_1` ... for `inference.num_servers` > 1."""
    return ["inference", *(f"inference_{i}" for i in range(1, config.inference.num_servers))]


def assign_transfer_ranks(config: RLConfig, servers: list[InferenceConfig], address: str) -> None:
    """The weight transfer group (`weight_transfer.mode = "distributed"`) at `address`: the trainer's rank 0, then
    each server's ranks in order: one for a builtin server, one per tensor-parallel worker for vLLM."""
    per_server = config.inference.vllm.tensor_parallel_size if resolved_backend(config.inference.backend) == "vllm" \
        else 1
    # The servers join once started (vLLM: after loading and compiling), which may take startup_timeout_s.
    setup_s = max(config.weight_transfer.timeout_s, config.deployment.startup_timeout_s)
    transfer = config.weight_transfer.model_copy(update={"address": address, "servers": len(servers),
                                                         "ranks_per_server": per_server, "timeout_s": setup_s})
    config.trainer.weight_transfer = transfer
    for i, server in enumerate(servers):
        server.weight_transfer = transfer.model_copy(update={"rank": 1 + i * per_server})


def is_server(name: str) -> bool:
    return name in SERVERS or name.startswith("inference_")


# Where each child reads the inference API key from: its config field as a PRIME_ variable.
API_KEY_ENV = {"inference": "PRIME_API_KEY", "orchestrator": "PRIME_CLIENT__API_KEY"}


def run_api_key(config: RLConfig) -> dict[str, dict[str, str]]:
    """The environment that carries the run's inference API key to each child that needs it.

    The key is `inference.api_key` or `orchestrator.client.api_key` (they must agree), else a
    random one per run. It travels only through the children's environment: the fields are
    left out of every config dump, so it is never in configs/, on a command line or in a log.
    """
    mine, theirs = config.inference.api_key, config.orchestrator.client.api_key
    if mine and theirs and mine.get_secret_value() != theirs.get_secret_value():
        raise ConfigError("inference.api_key and orchestrator.client.api_key differ: set inference.api_key alone")
    key = (mine or theirs).get_secret_value() if (mine or theirs) else secrets.token_urlsafe(32)
    env = {name: {variable: key} for name, variable in API_KEY_ENV.items()}
    if starts_teacher(config):  # the teacher server rl starts takes the run's key
        env[TEACHER] = {"PRIME_API_KEY": key}
        env["orchestrator"]["PRIME_TEACHER__API_KEY"] = key
    elif config.teacher is not None and config.teacher.api_key is not None:
        env["orchestrator"]["PRIME_TEACHER__API_KEY"] = config.teacher.api_key.get_secret_value()
    return env


def child_env(cuda_devices: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # PRIME_* variables were already applied to the resolved configs; children must not re-apply them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    env.update({"CUDA_VISIBLE_DEVICES": cuda_devices, "PYTHONUNBUFFERED": "1", LOG_FILE_BY_PARENT_ENV: "1"})
    env.update(extra or {})
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
              max_steps: int) -> None:
    """Poll until the trainer and orchestrator here finish (a server-only rl of a split run: until the trainer
    elsewhere has logged step max_steps - 1); raise on the first failure."""
    workers = [children[name] for name in ("trainer", "orchestrator") if name in children]
    reported: set[str] = set()
    while True:
        tail.poll()
        view.update(tail)
        for child in children.values():
            code = child.poll()
            if code not in (None, 0) or (is_server(child.name) and code is not None):
                if child.name.startswith("inference") and spare_server(children, child, reported):
                    continue
                raise failure(child, run_dir)
        if workers and all(child.poll() == 0 for child in workers):
            return
        trained = tail.last("trainer", "perf/step_time_s")
        if not workers and trained is not None and trained[0] + 1 >= max_steps:
            return
        time.sleep(POLL_S)


def launch(config: RLConfig) -> None:
    console = Console(stderr=False)
    if config.slurm is not None:  # write the job script, run nothing
        script = slurm.write_script(config)
        console.print(f"wrote {script} ({config.slurm.nodes} node(s)); submit it with: sbatch {script}")
        return
    start = time.monotonic()
    rl_toml = config.recorded()  # before launching fills in ports, ranks, devices
    config.model.path  # noqa: B018 -- a missing local model is an input error: report it before creating anything
    key_env = run_api_key(config)
    here = set(config.deployment.components)
    owner = "trainer" in here  # owns the run directory; a server node's rl keeps to nodes/<hostname>/
    base = config.output_dir if owner else node_dir(config.output_dir, socket.gethostname())
    # Every check first (the config's own ran at load time); only then change the run directory.
    doomed = prepare_output_dir(config) if owner else []
    resumed = pin_resume_step(config)
    inference_devices, trainer_devices = assign_devices(config)
    server_devices = split_devices(inference_devices, config.inference.num_servers)
    match_inference_dtype(config, bool(trainer_devices))
    config.inference.weight_dirs = [*config.inference.weight_dirs, weights_root(config.output_dir).absolute()]
    servers = {"inference": config.inference}  # the policy's servers (more with inference.num_servers)
    if "inference" in here:
        config.inference.port = server_port(config.inference.host, config.inference.port
                                             if "port" in config.inference.model_fields_set else 0)
        for name in policy_servers(config)[1:]:
            servers[name] = config.inference.model_copy(update={"port": server_port(config.inference.host, 0)})
        urls = [f"http://{server.host}:{server.port}/v1" for server in servers.values()]
        config.orchestrator.client.base_url = urls if len(urls) > 1 else urls[0]
    if config.weight_transfer.mode == "distributed":
        assign_transfer_ranks(config, list(servers.values()), f"127.0.0.1:{server_port('127.0.0.1', 0)}")
    teacher = teacher_server(config, server_port(config.inference.host, 0)) if starts_teacher(config) else None
    output_dir.check_writable(config.output_dir)
    if owner:
        output_dir.delete(doomed)
        if resumed is not None:
            clear_after(config, resumed)
        output_dir.mark(config.output_dir, config.command)

    config.orchestrator.trainer_world_size = config.trainer.num_processes * config.deployment.trainer_nodes

    if teacher is not None:
        url = f"http://{teacher.host}:{teacher.port}/v1"
        config.orchestrator.teacher = config.teacher.model_copy(update={"base_url": url})
        write_toml(config_file(base, TEACHER), teacher.model_dump(mode="json"))

    for name in COMPONENTS:
        if name in here:
            write_toml(config_file(base, name), getattr(config, name).model_dump(mode="json"))
    for name, server in list(servers.items())[1:]:
        write_toml(config_file(base, name), server.model_dump(mode="json"))
    if owner:
        write_toml(config_file(config.output_dir, "rl"), rl_toml)

    commands = component_commands(config, base)
    devices = {TEACHER: inference_devices, "orchestrator": "", "trainer": trainer_devices,
               **dict(zip(servers, server_devices, strict=True))}
    children = {
        name: Child(name, commands[name], log_file(base, name),
                    child_env(devices[name], key_env.get(name, key_env["inference"] if is_server(name) else None)))
        for name in commands
    }
    signal.signal(signal.SIGTERM, _interrupt)

    # A server node reads the trainer's progress from the shared file: only what this run writes from now on.
    tail = MetricsTail(metrics_file(config.output_dir), since=0.0 if owner else time.time())
    view = None
    interrupted = False
    try:
        console.print(f"[bold]rl[/]: outputs in {config.output_dir}, logs in {log_file(base, 'rl').parent}")
        if resumed is not None:
            console.print(f"resuming after step {resumed} (checkpoints/step_{resumed})")
        # The trainer needs nothing from the server: it starts (imports, loads the model) meanwhile.
        for name in (*servers, TEACHER, "trainer"):
            if name in children:
                children[name].start()
        waits = [(name, f"http://{server.host}:{server.port}/health", children[name])
                 for name, server in (*servers.items(), (TEACHER, teacher)) if name in children]
        if "orchestrator" in children and "inference" not in children:  # a split run: the server runs elsewhere
            waits += [("inference", f"{server_root(url)}/health", None) for url in config.orchestrator.client.urls]
        for name, health, child in waits:
            console.print(f"waiting for the {name} server ({health}) ...")
            wait_for_health(health, child, config.deployment.startup_timeout_s, config.output_dir)
        if "orchestrator" in children:
            children["orchestrator"].start()
        if not owner and "orchestrator" not in children:
            console.print(f"serving at http://{config.inference.host}:{config.inference.port}/v1 until the trainer "
                          "elsewhere logs its last step (Ctrl-C stops it sooner)")
        view = ProgressView(console, config.max_steps, resumed or 0)
        supervise(children, view, tail, config.output_dir, config.max_steps)
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

    if not owner:  # the trainer node's rl writes the plot and the summary
        console.print("the trainer logged its last step: the server node is done")
        return
    tail.poll()
    plot = write_plot(tail, metrics_plot(config.output_dir))
    for line in summary_lines(tail, time.monotonic() - start, config.output_dir):
        console.print(line)
    if plot is not None:
        console.print(f"plot: {plot}")


def main(argv: list[str] | None = None) -> None:
    run_main(RLConfig, launch, argv)


if __name__ == "__main__":
    main()

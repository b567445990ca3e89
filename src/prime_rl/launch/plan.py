"""What an `rl` run starts, decided from the validated config before anything on disk changes or starts.

`plan_run(config)` takes the config as loaded and returns a `RunPlan`: a copy of it with this run's ports,
server URLs, transfer ranks, devices, compute dtypes and pinned resume step filled in, each component's config
as `configs/<name>.toml` will hold it, what `--overwrite` will delete, and the environment that carries the
API key to each child. Every check that can fail (a busy port, missing devices, no complete checkpoint to
resume, a directory that is not a run) fails here, before `prepare_run_dir` deletes or writes anything.

`launch/rl.py` carries a plan out with processes; the test suite carries the same plan out in one process
(`tests/support/rl_in_process.py`), so both run exactly the component configs `rl` derives.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from prime_rl import run_lock
from prime_rl.configs.base import config_data, with_values
from prime_rl.configs.shared import ModelConfig, WeightTransferConfig
from prime_rl.configs.toml_io import write_toml
from prime_rl.envs.judge import RL_JUDGE_ENV
from prime_rl.inference.config import VLLM_MISSING, InferenceConfig, resolved_backend, vllm_available
from prime_rl.launch import output_dir
from prime_rl.launch.rl_config import COMPONENTS, RLConfig
from prime_rl.monitor.sinks import drop_steps_from
from prime_rl.run_dir import (
    ORCHESTRATOR,
    TRAINER,
    checkpoint_dir,
    config_file,
    discard_after,
    metrics_file,
    node_dir,
    prune_checkpoints,
    remove_temporaries,
    resolve_resume_step,
    weights_root,
)
from prime_rl.utils.checksums import verify_manifest
from prime_rl.utils.devices import cuda_device_count
from prime_rl.utils.errors import ConfigError
from prime_rl.utils.net import listening_socket

RUN_PARTS = (TRAINER, ORCHESTRATOR)  # what a checkpoint step of an rl run must hold to resume from
TEACHER = "teacher"  # the teacher's server: its config and log file names
JUDGE = "judge"  # the judge's server (a `[judge]`): its config and log file names
SIDE_SERVERS = (TEACHER, JUDGE)
SERVERS = ("inference", *SIDE_SERVERS)  # children that must never exit while the run goes on (one policy server of
# several, `inference_<i>`, may: the orchestrator drops it)
# Where each child reads the inference API key from: its config field as a PRIME_ variable.
API_KEY_ENV = {"inference": "PRIME_API_KEY", "orchestrator": "PRIME_CLIENT__API_KEY"}


@dataclass(frozen=True)
class RunPlan:
    """One `rl` run, decided: `config` is a copy of the loaded config with every run-time value filled in (the
    loaded config itself is never changed)."""

    config: RLConfig
    recorded: dict
    """`configs/rl.toml`: what the user set (`RLConfig.recorded`), taken before anything was filled in."""
    owner: bool
    """This rl runs the trainer, so it owns the run directory (a split run's server node does not)."""
    base: Path
    """Where this rl keeps `configs/` and `logs/`: the output dir, or a server node's `nodes/<hostname>/`."""
    doomed: list[Path]
    """What `--overwrite` deletes (`launch/output_dir.py`)."""
    resumed: int | None
    """The checkpoint step a resume continues after (`ckpt.resume_step` pinned to a number), else None."""
    servers: dict[str, InferenceConfig]
    """The policy's servers this rl starts, by name: `inference`, `inference_1`, ... (none on a trainer node)."""
    side: dict[str, InferenceConfig]
    """The servers beside the policy's this rl starts, by name: the teacher's (a `[teacher]` without `base_url`) and
    the judge's (a `[judge]`)."""
    devices: dict[str, str]
    """CUDA_VISIBLE_DEVICES of each child ('' on CPU)."""
    key_env: dict[str, dict[str, str]]
    """The environment that carries the run's inference API key to each child that needs it (`run_api_key`)."""

    @property
    def components(self) -> dict[str, BaseModel]:
        """Every config this rl writes to `configs/`, by file name: the servers, the teacher's, the orchestrator's
        and the trainer's (those of `deployment.components`)."""
        here = self.config.deployment.components
        configs: dict[str, BaseModel] = {**self.servers, **self.side}
        configs |= {name: getattr(self.config, name) for name in COMPONENTS if name in here and name != "inference"}
        return configs


def plan_run(loaded: RLConfig) -> RunPlan:
    """Decide the run (module docstring); raises ConfigError/UserError on anything that cannot work. The run's
    values are filled in on copies (`with_values`): `loaded` is never changed."""
    config = loaded
    recorded = config.recorded()
    config.model.path  # noqa: B018 -- a missing local model is an input error: report it before creating anything
    key_env = run_api_key(config)
    here = set(config.deployment.components)
    owner = "trainer" in here
    base = config.output_dir if owner else node_dir(config.output_dir, socket.gethostname())
    doomed = prepare_output_dir(config) if owner else []
    resumed = resume_step(config)
    if resumed is not None and owner:
        verify_resume_checkpoint(config, resumed)
    inference_devices, trainer_devices = assign_devices(config)
    server_devices = split_devices(inference_devices, config.inference.num_servers)
    values = inference_dtypes(config, bool(trainer_devices))
    if resumed is not None:  # every part resumes from the same step
        values |= {f"{where}ckpt.resume_step": resumed for where in ("", "trainer.", "orchestrator.")}
    values["inference.weight_dirs"] = [*config.inference.weight_dirs, weights_root(config.output_dir).absolute()]
    if "inference" in here:
        values["inference.port"] = server_port(config.inference.host, config.inference.port
                                               if "port" in config.inference.model_fields_set else 0)
    values["orchestrator.trainer_world_size"] = config.trainer.num_processes * config.deployment.trainer_nodes
    # vLLM samples every output row; the builtin server only the tokenizer's ids: the trainer scores the same set.
    values["trainer.sampled_vocab"] = "model" if resolved_backend(config.inference.backend) == "vllm" else "tokenizer"
    config = with_values(config, values)

    servers: dict[str, InferenceConfig] = {}
    values = {}
    if "inference" in here:
        servers["inference"] = config.inference
        for name in policy_servers(config)[1:]:
            servers[name] = config.inference.model_copy(update={"port": server_port(config.inference.host, 0)})
        urls = [f"http://{server.host}:{server.port}/v1" for server in servers.values()]
        values["orchestrator.client.base_url"] = urls if len(urls) > 1 else urls[0]
    if config.weight_transfer.mode == "distributed":
        transfer, ranks = transfer_group(config, len(servers), f"127.0.0.1:{server_port('127.0.0.1', 0)}")
        values["trainer.weight_transfer"] = transfer
        servers = {name: server.model_copy(update={"weight_transfer": rank})
                   for (name, server), rank in zip(servers.items(), ranks, strict=True)}
        if "inference" in servers:
            values["inference.weight_transfer"] = servers["inference"].weight_transfer
    side: dict[str, InferenceConfig] = {}
    if starts_teacher(config):
        side[TEACHER] = teacher = teacher_server(config, server_port(config.inference.host, 0))
        values["orchestrator.teacher"] = config.teacher.model_copy(
            update={"base_url": f"http://{teacher.host}:{teacher.port}/v1"})
    if config.judge is not None:
        side[JUDGE] = judge = judge_server(config, server_port(config.inference.host, 0))
        key_env["orchestrator"] |= {RL_JUDGE_ENV["base_url"]: f"http://{judge.host}:{judge.port}/v1",
                                    RL_JUDGE_ENV["model"]: judge.model.name}
    config = with_values(config, values)
    if "inference" in servers:
        servers["inference"] = config.inference
    for name, server in (*servers.items(), *side.items()):
        if resolved_backend(server.backend) == "vllm" and not vllm_available():
            raise ConfigError(f"{name} server: {VLLM_MISSING}")
    devices = {**dict.fromkeys(SIDE_SERVERS, inference_devices), "orchestrator": "", "trainer": trainer_devices,
               **dict(zip(policy_servers(config), server_devices, strict=True))}
    return RunPlan(config, recorded, owner, base, doomed, resumed, servers, side, devices, key_env)


def prepare_run_dir(plan: RunPlan) -> run_lock.RunLock | None:
    """The only step that changes the run directory, after every check passed: take the run lock (refused while
    another rl runs there), delete what `--overwrite` deletes, clear what a resume re-creates (`clear_after`),
    mark the directory as a run, write `configs/`. Returns the lock (None for a server node's rl, which does not
    own the directory): hold it while the run goes on."""
    config = plan.config
    output_dir.check_writable(config.output_dir)
    lock = run_lock.take(config.output_dir, config.command) if plan.owner else None
    if plan.owner:
        output_dir.delete(plan.doomed)
        if plan.resumed is not None:
            clear_after(config, plan.resumed)
        output_dir.mark(config.output_dir, config.command)
    for name, component in plan.components.items():
        write_toml(config_file(plan.base, name), config_data(component))
    if plan.owner:
        write_toml(config_file(config.output_dir, "rl"), plan.recorded)
    return lock


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


def resume_step(config: RLConfig) -> int | None:
    """The one complete (trainer + orchestrator) checkpoint step N the run and its components resume from:
    `ckpt.resume_step` with 'latest' the newest (`run_dir.resolve_resume_step`); None without a resume."""
    wanted = config.ckpt.resume_step
    return None if wanted is None else resolve_resume_step(config.output_dir, wanted, RUN_PARTS)


def verify_resume_checkpoint(config: RLConfig, step: int) -> None:
    """Every part of checkpoint `step` matches its manifest (`utils/checksums`), checked before anything of the run
    is discarded: a damaged checkpoint is a one-line CorruptCheckpoint (exit 2) naming the file, and the run
    directory stays as it was (the components verify it again as they load it)."""
    for part in RUN_PARTS:
        verify_manifest(checkpoint_dir(config.output_dir, step, part))


def clear_after(config: RLConfig, step: int) -> None:
    """What the interrupted run made after checkpoint `step` goes, so the resumed processes regenerate it
    instead of mixing two runs: rollout batches >= step, weights > step, the metrics.jsonl lines of
    steps >= step (the progress bar then starts there), checkpoints after `step` (a resume from an older step
    abandons them). Temporaries of interrupted writes go too, and the retention rule (`ckpt.keep`) is applied
    again: a process killed between its checkpoint's write and its pruning left one too many."""
    remove_temporaries(config.output_dir)
    discard_after(config.output_dir, step)
    prune_checkpoints(config.output_dir, config.ckpt.keep, RUN_PARTS)
    drop_steps_from(metrics_file(config.output_dir), step, ("trainer", "orchestrator"))


def assign_devices(config: RLConfig) -> tuple[str, str]:
    """CUDA_VISIBLE_DEVICES for inference and trainer ('' on a machine without GPUs)."""
    count = cuda_device_count()
    deployment = config.deployment
    here = deployment.components  # a split run's node checks only what it starts
    wanted = [ids for ids, name in ((deployment.inference_gpu_ids, "inference"),
                                    (deployment.trainer_gpu_ids, "trainer"))
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


def inference_dtypes(config: RLConfig, trainer_on_gpu: bool) -> dict[str, str]:
    """The inference servers compute in the trainer's compute dtype unless set: bfloat16 where the trainer runs
    on GPUs in bf16 mixed precision (`runtime.dtype` auto or bfloat16), float32 otherwise, so that on-policy
    logprobs agree (ratio 1 at max_async_level 0) on GPU as on CPU. Returns the dotted keys to fill in."""
    bf16 = trainer_on_gpu and config.trainer.runtime.dtype in ("auto", "bfloat16")
    dtype = "bfloat16" if bf16 else "float32"
    return {f"inference.{backend}.dtype": dtype for backend in ("builtin", "vllm")
            if "dtype" not in getattr(config.inference, backend).model_fields_set}


def starts_teacher(config: RLConfig) -> bool:
    """Whether rl starts the teacher's server: a `[teacher]` without `base_url`."""
    return config.teacher is not None and config.teacher.base_url is None


def teacher_server(config: RLConfig, port: int) -> InferenceConfig:
    """The teacher's server: one token more context than seq_len (a scoring request generates one)."""
    return side_server(config, config.teacher.model, config.teacher.backend, port, config.seq_len + 1)


def judge_server(config: RLConfig, port: int) -> InferenceConfig:
    """The judge's server: the policy server's context."""
    return side_server(config, config.judge.model, config.judge.backend, port, config.inference.seq_len)


def side_server(config: RLConfig, model: ModelConfig, backend: str, port: int, seq_len: int) -> InferenceConfig:
    """A server beside the policy's (the teacher's: `seq_len` one token more than the run's, as a scoring request
    generates one; the judge's): inference's config with this model and backend, its own port, no weight updates
    (none from directories, none over the transfer group), one server."""
    vllm = config.inference.vllm.model_copy(update={"max_model_len": None, "max_lora_rank": None})
    return config.inference.model_copy(deep=True, update={
        "model": model, "backend": backend, "port": port, "seq_len": seq_len,
        "weight_dirs": [], "vllm": vllm, "weight_transfer": WeightTransferConfig(), "num_servers": 1})


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


def transfer_group(config: RLConfig, servers: int, address: str
                   ) -> tuple[WeightTransferConfig, list[WeightTransferConfig]]:
    """The weight transfer group (`weight_transfer.mode = "distributed"`) at `address`: the trainer's rank 0, then
    each server's ranks in order: one for a builtin server, one per tensor-parallel worker for vLLM. Returns the
    trainer's `weight_transfer` and each server's."""
    per_server = config.inference.vllm.tensor_parallel_size if resolved_backend(config.inference.backend) == "vllm" \
        else 1
    # The servers join once started (vLLM: after loading and compiling), which may take startup_timeout_s.
    setup_s = max(config.weight_transfer.timeout_s, config.deployment.startup_timeout_s)
    transfer = config.weight_transfer.model_copy(update={"address": address, "servers": servers,
                                                         "ranks_per_server": per_server, "timeout_s": setup_s})
    return transfer, [transfer.model_copy(update={"rank": 1 + i * per_server}) for i in range(servers)]


def is_server(name: str) -> bool:
    return name in SERVERS or name.startswith("inference_")


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
    if config.judge is not None:  # so does the judge's
        env[JUDGE] = {"PRIME_API_KEY": key}
        env["orchestrator"][RL_JUDGE_ENV["key"]] = key
    elif config.teacher is not None and config.teacher.api_key is not None:
        env["orchestrator"]["PRIME_TEACHER__API_KEY"] = config.teacher.api_key.get_secret_value()
    return env

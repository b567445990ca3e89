"""Config sections used by more than one component (the keys `rl` hands down)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from prime_rl.configs.base import BaseConfig, EntrypointConfig
from prime_rl.configs.model_info import context_length
from prime_rl.configs.validators import OutputDir
from prime_rl.models.embedded import resolve_model_path

PositiveInt = Annotated[int, Field(gt=0)]
AsyncLevel = Annotated[int, Field(ge=0)]
"""`max_async_level`'s type, the one place its bound is written: rollouts of step n may use weights of step m only
if n - m <= this (0: on-policy). rl, the orchestrator and the trainer each have the key (rl hands it down)."""
ASYNC_LEVEL_DEFAULT = 1


class ModelConfig(BaseConfig):
    """Which model every component loads."""

    name: str = "tiny-reverse-text"
    """An embedded model ('tiny-reverse-text', the default), 'SmolLM2-135M-Instruct', a local Hugging Face model
    directory, or a hub name already in the Hugging Face cache: nothing is downloaded (docs/models.md)."""

    trust_remote_code: bool = False
    """Allow model code shipped with the checkpoint (transformers' trust_remote_code)."""

    @property
    def path(self) -> str:
        """What to hand to `from_pretrained`: an embedded model's directory, else `name` unchanged."""
        return resolve_model_path(self.name)

    def context_length(self) -> tuple[int, Path] | None:
        """(max_position_embeddings, the config.json read) when the model is on this machine, else None."""
        return context_length(self.name)


class WandbConfig(BaseConfig):
    """Weights & Biases logging. Metrics always go to metrics.jsonl too."""

    project: str = "prime-rl"
    """W&B project."""

    name: str | None = None
    """Run name (default: the output directory's name)."""

    mode: Literal["online", "offline", "disabled"] | None = None
    """online, offline or disabled (default: online if WANDB_API_KEY is set, else offline)."""


class CkptConfig(BaseConfig):
    """Checkpoints for resuming (trainer and orchestrator state)."""

    interval: PositiveInt | None = 50
    """Checkpoint every this many steps (and always at the end), so a run that dies loses at most this many steps
    (resume with `--ckpt.resume-step latest`); none: only at the end."""

    resume_step: PositiveInt | Literal["latest"] | None = None
    """Resume from checkpoints/step_N (an integer) or the newest one ('latest')."""

    keep: PositiveInt | None = 2
    """Keep only the newest this many complete checkpoints, so a long run's disk use stays bounded (none: keep
    all)."""


class RunConfig(EntrypointConfig):
    """Keys every component of one run agrees on; `rl` owns them and hands them down."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model."""

    output_dir: OutputDir = Path("outputs/run")
    """Run directory: configs, rollouts, weights, checkpoints, logs, metrics; must be a creatable, writable
    directory."""

    max_steps: PositiveInt = 20
    """Number of optimizer steps (= rollout batches)."""

    seq_len: PositiveInt = 2048
    """Tokens per packed training row, i.e. per trainer forward/backward (shared prompts count once), and the
    longest sample (prompt + completion)."""

    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] = 0
    """Seed for sampling prompts, initialisation and generation."""

    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B logging."""


class WeightTransferConfig(BaseConfig):
    """How weight updates reach the inference servers (`rl` sets everything but `mode` and `timeout_s`)."""

    mode: Literal["filesystem", "distributed"] = "filesystem"
    """filesystem: the trainer writes weights/step_N and each server loads it; distributed: the trainer's rank 0
    broadcasts them to every server over a torch.distributed group (gloo on CPU, NCCL on GPU) and writes only a
    marker weights/step_N/transfer.json (docs/inference.md#weight-transfer-over-torchdistributed)."""
    address: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+:[0-9]+$")] | None = None
    """host:port of the group's store, on the trainer's rank 0 (rl: a free port on 127.0.0.1)."""
    servers: Annotated[int, Field(ge=1)] = 1
    """Inference servers in the group (rl: inference.num_servers)."""
    ranks_per_server: Annotated[int, Field(ge=1)] = 1
    """Group ranks of one server: 1 for the builtin backend, vLLM's tensor_parallel_size (each worker receives the
    full weights and loads its shard; rl sets it). The group has 1 + servers * ranks_per_server ranks."""
    rank: Annotated[int, Field(ge=0)] = 0
    """This process's rank in the group: 0 the trainer; a server's first rank (server s of 0..servers-1:
    1 + s * ranks_per_server; a vLLM worker adds its tensor-parallel rank). rl sets each."""
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Longest the group's setup or one update's broadcasts may take (rl: at least deployment.startup_timeout_s,
    since the servers join once started). Between updates a server waits without limit."""

    @property
    def world_size(self) -> int:
        """Ranks in the group: the trainer's rank 0 and every server's ranks."""
        return 1 + self.servers * self.ranks_per_server

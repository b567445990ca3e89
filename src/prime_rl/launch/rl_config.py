"""The composite config of `rl`: shared keys plus the three component configs.

`rl` owns the shared keys (`model`, `output_dir`, `max_steps`, `seq_len`, `seed`,
`wandb`, `max_async_level`, `loss`, `ckpt`, `teacher`, `weight_transfer`) and hands each one down to every
component config that has it (`RLConfig.derived_values`, on a copy). A component that sets a shared key itself
must agree with `rl`'s value; a different value is an error, never a silent override.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from prime_rl.configs.base import BaseConfig, config_data, with_values
from prime_rl.configs.loss import DefaultLossConfig, LossConfig
from prime_rl.configs.shared import (
    ASYNC_LEVEL_DEFAULT,
    AsyncLevel,
    CkptConfig,
    ModelConfig,
    RunConfig,
    WeightTransferConfig,
)
from prime_rl.inference.config import BACKENDS, IN_FLIGHT_VLLM, InferenceConfig, installed_vllm, resolved_backend
from prime_rl.orchestrator.config import OrchestratorConfig, TeacherConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.utils.errors import UserError

SHARED_KEYS = ("model", "output_dir", "max_steps", "seq_len", "seed", "wandb", "max_async_level", "loss", "ckpt",
               "teacher", "weight_transfer")
COMPONENTS = ("inference", "orchestrator", "trainer")


class DeploymentConfig(BaseConfig):
    """Where each component runs."""

    inference_gpu_ids: list[int] = Field(default_factory=list)
    """CUDA devices for the inference server (empty: GPU 0 if there is one, else CPU)."""
    trainer_gpu_ids: list[int] = Field(default_factory=list)
    """CUDA devices for the trainer (empty: the next GPU after inference's, else CPU)."""
    startup_timeout_s: Annotated[float, Field(gt=0)] = 900.0
    """How long to wait for the inference server's /health before giving up."""
    max_restarts: Annotated[int, Field(ge=0)] = 3
    """Restarts of one component within restart_window_s. An inference server (the policy's, a teacher's, a judge's)
    that exits or hangs (hang_timeout_s) is started again alone: the orchestrator loads the newest weights on it and
    retries its requests. A trainer or orchestrator that exits runs the whole run again from its newest complete
    checkpoint (not after a user error, exit code 2, a non-finite loss, exit code 3, or on a full disk). Past them
    the run stops with one line (of several policy servers, it goes on without that one). 0: nothing is restarted
    (docs/deployment.md#when-a-process-dies). A policy server fed over NCCL (weight_transfer.mode = 'distributed')
    is not restarted alone."""
    restart_window_s: Annotated[float, Field(gt=0)] = 3600.0
    """The window max_restarts counts in; a server's k-th restart in it waits 2^(k-1) s first."""
    hang_timeout_s: Annotated[float, Field(ge=10)] | None = 300.0
    """An inference server whose /health has not answered for this long is killed and restarted like one that died
    (a stopped or stuck process); at least 10 s (/health is asked every 2 s and given 5 s to answer); none: only a
    server that exits (or a restarted one that does not answer within startup_timeout_s) is."""
    components: list[Literal["inference", "orchestrator", "trainer"]] = Field(
        default_factory=lambda: ["inference", "orchestrator", "trainer"])
    """The components this rl starts (a split run: one rl per node, each with some; docs/deployment.md#multi-node)."""

    trainer_nodes: Annotated[int, Field(ge=1)] = 1
    """Nodes the trainer spans (torchrun --nnodes, c10d rendezvous at rdzv_endpoint); this rl starts the first, the
    others run torchrun themselves (the SLURM script does: docs/deployment.md#slurm). Ranks: trainer_nodes *
    trainer.num_processes."""
    rdzv_endpoint: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]+:[0-9]+$")] | None = None
    """host:port of the trainer's torchrun rendezvous when trainer_nodes > 1 (the first trainer node)."""

    @field_validator("components")
    @classmethod
    def _some_once(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError("must name each component at most once, and at least one")
        return value

    @property
    def split(self) -> bool:
        """Whether another rl starts some components of this run."""
        return len(self.components) < 3


class JudgeServerConfig(BaseConfig):
    """A judge model rl serves for the `judge` reward (`[judge]`): an inference server of its own, started and
    stopped with the run; the orchestrator gets its URL (PRIME_JUDGE_BASE_URL), its model name (PRIME_JUDGE_MODEL) and
    the run's key (PRIME_JUDGE_API_KEY), which a judge reward without base_url uses."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The judge model (a local path, or an embedded model's name)."""
    backend: Literal[(*BACKENDS.names, "auto")] = "auto"  # type: ignore[valid-type]
    """Backend of the judge's server (its other options are inference's)."""


class SlurmConfig(BaseConfig):
    """`rl --slurm.nodes N`: write an sbatch script for N nodes instead of running (`launch/slurm.py`,
    docs/deployment.md#slurm)."""

    nodes: Annotated[int, Field(ge=1)] = 1
    """Nodes: 1 runs everything on it; N >= 2 puts the inference server on the first and the orchestrator and a
    trainer spanning the other N - 1 (torchrun rendezvous) after it."""
    gpus_per_node: Annotated[int, Field(ge=1)] | None = None
    """#SBATCH --gpus-per-node (none: not set)."""
    partition: Annotated[str, Field(min_length=1)] | None = None
    """#SBATCH --partition (none: the cluster's default)."""
    time: Annotated[str, Field(pattern=r"^[0-9:-]+$")] | None = None
    """#SBATCH --time, e.g. 04:00:00 (none: the partition's limit)."""
    job_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = "prime-rl"
    """#SBATCH --job-name."""
    inference_port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """Port of the inference server on the first node."""
    rdzv_port: Annotated[int, Field(ge=1, le=65535)] = 29500
    """Port of the trainer's torchrun rendezvous on the second node."""
    dir: Path | None = None
    """Where the script (rl.sbatch), the config it runs (rl.toml) and the job's output go; none:
    <output_dir>/slurm-job."""

    @field_validator("time", mode="before")
    @classmethod
    def _time_as_written(cls, value: object) -> object:
        """TOML (and so the command line) reads 04:00:00 as a time of day: keep it as SLURM writes it."""
        return value.isoformat() if isinstance(value, datetime.time) else value


def handed_down(shared: BaseModel, sub: BaseModel, names: Iterable[str], where: str) -> dict[str, Any]:
    """The values `sub` (at dotted key `where`) takes from `shared`: its fields `names`, as dotted keys for
    `with_values`; a value `sub` set explicitly must agree (ValueError naming the key).

    Sections of the same type recurse field by field, so a component's own extra fields
    survive and only an explicitly set, different leaf is a contradiction.
    """
    values: dict[str, Any] = {}
    for name in names:
        mine, theirs = getattr(shared, name), getattr(sub, name)
        key = f"{where}.{name}"
        if isinstance(mine, BaseModel) and type(theirs) is type(mine):
            values |= handed_down(mine, theirs, type(mine).model_fields, key)
            continue
        if name in sub.model_fields_set and theirs != mine:
            raise ValueError(f"'{key}' = {theirs!r} contradicts the shared value {mine!r}; "
                             "set it once, at the top level")
        values[key] = mine
    return values


class RLConfig(RunConfig):
    """rl: one TOML for the inference server, orchestrator and trainer of an RL run."""

    command = "rl"
    help_hidden = SHARED_KEYS

    max_async_level: AsyncLevel = ASYNC_LEVEL_DEFAULT
    """Rollouts of step n may use weights of step m only if n - m <= this (0: on-policy)."""
    loss: LossConfig = Field(default_factory=DefaultLossConfig)
    """Policy loss (see docs/losses.md); handed to the trainer."""
    ckpt: CkptConfig = Field(default_factory=CkptConfig)
    """Checkpointing and resume (trainer and orchestrator)."""
    deployment: DeploymentConfig = Field(default_factory=DeploymentConfig)
    """Device placement."""
    teacher: TeacherConfig | None = None
    """On-policy distillation from a teacher model (docs/losses.md#on-policy-distillation); handed to the
    orchestrator. Without teacher.base_url rl starts the teacher's server (a second inference process with
    inference's options, on a free port and the inference devices)."""
    judge: JudgeServerConfig | None = None
    """A judge model rl serves beside the policy, for the `judge` reward (docs/environments.md#llm-judges): a third
    inference process with inference's options, on a free port and the inference devices; the orchestrator gets its
    URL, model name and key, so a judge reward with no base_url uses it."""
    weight_transfer: WeightTransferConfig = Field(default_factory=WeightTransferConfig)
    """How weight updates reach the inference servers: mode = "filesystem" (weights/step_N) or "distributed" (a
    torch.distributed broadcast from the trainer); handed to the trainer and the servers."""
    slurm: SlurmConfig | None = None
    """Write an sbatch script for this run instead of running it (docs/deployment.md#slurm); none: run here."""
    overwrite: bool = False
    """Delete a previous rl run's outputs in output_dir first, after every check passed: only run artifacts, only in a
    directory rl marked (.prime-rl-run); other files stay. Without it an existing run is an error unless resuming."""

    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    """The inference server."""
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    """The orchestrator."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The trainer."""

    def recorded(self) -> dict:
        """The config as a file records it (`configs/rl.toml`, the SLURM job's `rl.toml`): without `overwrite`
        (running the file again must not delete the run it describes), without `ckpt.resume_step` (a rerun would
        roll back to it) and without what rl hands down into the
        component sections (the shared keys, trainer.advantage), which the next rl hands down again: so
        `rl @ configs/rl.toml --max-steps 200` goes on. Take it before `launch` fills in this run's ports,
        transfer ranks, devices and teacher URL."""
        # Only what was set: a default written out would count as set when read back (a fixed port, a pinned dtype).
        recorded = config_data(self, exclude={"overwrite"}, exclude_unset=True)
        for name in COMPONENTS:
            for key in SHARED_KEYS:
                recorded.get(name, {}).pop(key, None)
        recorded.get("trainer", {}).pop("advantage", None)  # handed down from orchestrator.advantage
        recorded.get("ckpt", {}).pop("resume_step", None)  # a later run resumes where it is told, not here again
        return recorded

    def _check_models_exist(self) -> None:
        """A model rl loads must be there before anything starts (not after the servers' start-up): the policy and
        a teacher rl serves, each a one-line error naming the command that writes it. A SLURM script is rendered
        for later, when an earlier job may have written them: not checked then."""
        if self.slurm is not None:
            return
        models = [("model", self.model)]
        if self.teacher is not None and self.teacher.base_url is None:
            models.append(("teacher.model", self.teacher.model))
        if self.judge is not None:
            models.append(("judge.model", self.judge.model))
        for key, model in models:
            try:
                model.path  # noqa: B018  (resolving it checks it)
            except UserError as exc:
                raise ValueError(f"{key}.name: {exc}") from None

    def _check_judge(self) -> None:
        """A judge reward without base_url scores with the judge rl serves: it needs a `[judge]`."""
        if self.judge is not None:
            return
        for env in self.orchestrator.env:
            rewards, options = env.args.get("rewards") or {}, env.args.get("reward_options") or {}
            if isinstance(rewards, dict) and "judge" in rewards and not (options.get("judge") or {}).get("base_url"):
                raise ValueError(f"orchestrator.env '{env.id}': the judge reward has no base_url: give the judge's "
                                 "URL (reward_options.judge.base_url), or a [judge] section for rl to serve one")

    def _check_request_budget(self) -> None:
        """The orchestrator's largest request (n = rollouts_per_example completions of max_tokens) must fit the
        servers' per-request token budget, or every rollout would be refused at run time."""
        asked = self.orchestrator.rollouts_per_example * self.orchestrator.sampling.max_tokens
        if asked > self.inference.max_request_tokens:
            raise ValueError(f"inference.max_request_tokens ({self.inference.max_request_tokens}) is below one "
                             f"rollout request's rollouts_per_example x sampling.max_tokens ({asked}): raise it")

    def _check_split(self) -> None:
        """A split run (`deployment.components`): each rl must know what the others run. The orchestrator needs the
        remote server's URL, the server a fixed port, both one API key given to every rl (a random one cannot be
        shared), a teacher its URL; only the rl that runs the trainer owns the run directory (`overwrite`)."""
        here = set(self.deployment.components)
        if not self.deployment.split:
            return
        if self.inference.num_servers > 1:
            raise ValueError("inference.num_servers > 1 is for one rl that runs everything; a split run's server node "
                             "runs one server (start one rl per server node, and list their URLs in "
                             "orchestrator.client.base_url)")
        if here not in ({"inference"}, {"orchestrator", "trainer"}):
            raise ValueError(f"deployment.components = {self.deployment.components}: a split run is one rl with "
                             "['inference'] (a server node) and one with ['orchestrator', 'trainer'] (both write the "
                             "run directory, so they start together)")
        if ("orchestrator" in here and "inference" not in here
                and "base_url" not in self.orchestrator.client.model_fields_set):
            raise ValueError("orchestrator.client.base_url: the inference server runs elsewhere "
                             "(deployment.components), so give its URL, e.g. http://node0:8000/v1")
        if "inference" in here and "orchestrator" not in here and ("port" not in self.inference.model_fields_set
                                                                   or self.inference.port == 0):
            raise ValueError("inference.port: the orchestrator runs elsewhere (deployment.components), so fix the port "
                             "it connects to")
        if ("inference" in here) != ("orchestrator" in here) and self.inference.api_key is None \
                and self.orchestrator.client.api_key is None:
            raise ValueError("a split run needs one API key in every rl: set PRIME_INFERENCE__API_KEY (the same value "
                             "on every node)")
        if self.teacher is not None and self.teacher.base_url is None:
            raise ValueError("teacher.base_url: a split run does not start the teacher's server; start it yourself "
                             "and give its URL")
        if self.judge is not None:
            raise ValueError("judge: a split run does not start the judge's server; start it yourself and give its "
                             "URL as the judge reward's base_url")
        if self.overwrite and "trainer" not in here:
            raise ValueError("overwrite: only the rl that runs the trainer owns the run directory "
                             "(deployment.components)")

    def derived(self) -> RLConfig:
        """What each component runs with, on a copy (`derived_values`)."""
        return with_values(self, self.derived_values())

    def derived_values(self) -> dict[str, Any]:
        """The values `rl` fills into its components, as dotted keys: every shared key handed down to each
        component that has it (`handed_down`: a component's own different value is a contradiction),
        `trainer.advantage` from `orchestrator.advantage`, `orchestrator.share_prompts` off under flash attention
        (unless set), and `inference.vllm.max_lora_rank` at `trainer.lora.rank` when the trainer publishes LoRA
        adapters (unless set), with `inference.vllm.max_loras` at max_async_level + 2 for continuous rollouts. The
        run's ports, devices and resume step are `launch/plan.py`'s (they need the
        machine and the run directory)."""
        values: dict[str, Any] = {}
        for component in COMPONENTS:
            sub = getattr(self, component)
            values |= handed_down(self, sub, [key for key in SHARED_KEYS if key in type(sub).model_fields], component)
        values["trainer.advantage"] = self.orchestrator.advantage
        if self.trainer.runtime.attn_implementation == "flash_attention_2":  # see orchestrator.share_prompts
            values["orchestrator.share_prompts"] = False
        lora = self.trainer.lora
        if lora is not None and not lora.merge and self.inference.vllm.max_lora_rank is None:
            values["inference.vllm.max_lora_rank"] = lora.rank  # the trainer publishes adapters: vLLM serves them
        if lora is not None and not lora.merge and self.orchestrator.rollout_mode == "continuous" and \
                "max_loras" not in self.inference.vllm.model_fields_set:
            # running requests keep the adapter of their admission: up to max_async_level + 1 steps, and the newest
            values["inference.vllm.max_loras"] = self.max_async_level + 2
        return values

    def check_consistency(self, prefix: str = "") -> None:
        """Check each component as `derived` hands it down, then the rules across components (it only checks).

        `--overwrite` (delete the run) and `ckpt.resume_step` (continue it) contradict each other; so does an
        `orchestrator.sampling.max_tokens` that leaves no room for a prompt in the server's context: `seq_len`
        (the builtin server's, and the length rollouts are packed to) or `inference.vllm.max_model_len` when
        set and vllm may serve. A trainer that publishes LoRA adapters needs `inference.vllm.max_lora_rank` >= its
        rank.
        """
        if "advantage" in self.trainer.model_fields_set and self.trainer.advantage != self.orchestrator.advantage:
            raise ValueError("trainer.advantage is handed down from orchestrator.advantage: "
                             "set only [orchestrator.advantage]")
        derived = self.derived()
        for component in COMPONENTS:
            getattr(derived, component).check_consistency(f"{component}.")
        if self.overwrite and self.ckpt.resume_step is not None:
            raise ValueError("overwrite deletes the run that ckpt.resume_step continues: give one of them")
        if self.trainer.runtime.attn_implementation == "flash_attention_2" and self.orchestrator.share_prompts \
                and "share_prompts" in self.orchestrator.model_fields_set:
            raise ValueError("orchestrator.share_prompts = true contradicts trainer.runtime.attn_implementation = "
                             "'flash_attention_2', which computes a shared prompt once per completion")
        lora = self.trainer.lora
        if self.orchestrator.rollout_mode == "continuous" and resolved_backend(self.inference.backend) == "vllm":
            spans_needed = (lora is None or lora.merge) and self.inference.vllm.in_flight_kv != "resubmit"
            version = installed_vllm()
            if spans_needed and version is not None and version < IN_FLIGHT_VLLM:
                raise ValueError(f"orchestrator.rollout_mode = 'continuous' on vLLM needs vLLM >= 0.32 (weight-version "
                                 f"spans per token) or inference.vllm.in_flight_kv = 'resubmit'; this is "
                                 f"{'.'.join(map(str, version))}")
        self._check_split()
        self._check_models_exist()
        self._check_judge()
        self._check_request_budget()
        if self.weight_transfer.mode == "distributed":
            if self.deployment.split:
                raise ValueError("weight_transfer.mode = 'distributed' needs every component in one rl (a split run "
                                 "moves weights through the shared filesystem)")
            if resolved_backend(self.inference.backend) == "vllm" and self.inference.vllm.data_parallel_size > 1:
                raise ValueError("weight_transfer.mode = 'distributed' with inference.vllm.data_parallel_size > 1 is "
                                 "not supported: run several servers instead (inference.num_servers)")
        if self.deployment.trainer_nodes > 1 and self.deployment.rdzv_endpoint is None:
            raise ValueError("deployment.trainer_nodes > 1 needs deployment.rdzv_endpoint (host:port of the first "
                             "trainer node) for torchrun's rendezvous")
        if lora is not None and not lora.merge and lora.modules_to_save and \
                resolved_backend(self.inference.backend) == "vllm":
            raise ValueError("trainer.lora.modules_to_save needs trainer.lora.merge = true on vLLM (its LoRA adapters "
                             "cannot carry fully trained modules)")
        served = self.inference.vllm.max_lora_rank
        if lora is not None and not lora.merge and served is not None and served < lora.rank:
            raise ValueError(f"inference.vllm.max_lora_rank = {served} is below trainer.lora.rank = {lora.rank}")
        limits = {"seq_len": self.seq_len}
        if self.inference.backend != "builtin" and self.inference.vllm.max_model_len is not None:
            limits["inference.vllm.max_model_len"] = self.inference.vllm.max_model_len
        max_tokens = self.orchestrator.sampling.max_tokens
        for key, limit in limits.items():
            if max_tokens >= limit:
                raise ValueError(f"orchestrator.sampling.max_tokens = {max_tokens} leaves no room for a prompt in "
                                 f"{key} = {limit} (prompt + completion must fit)")

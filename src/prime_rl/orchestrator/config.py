"""Config of the `orchestrator` entrypoint."""

from __future__ import annotations

import importlib.util
import math
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from prime_rl.configs.advantage import AdvantageConfig, GrpoAdvantageConfig
from prime_rl.configs.base import BaseConfig
from prime_rl.configs.shared import CkptConfig, RunConfig
from prime_rl.configs.validators import ApiKey
from prime_rl.envs import ENVIRONMENTS, load_env
from prime_rl.utils.errors import UserError

PositiveFloat = Annotated[float, Field(gt=0)]


class ClientConfig(BaseConfig):
    """How the orchestrator talks to the inference server."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """OpenAI API root of the inference server (the `rl` launcher sets it)."""
    timeout_s: PositiveFloat = 600.0
    """Longest one request (or weight update) may take before the run fails."""
    connect_timeout_s: PositiveFloat = 60.0
    """How long to keep retrying an unreachable server before the run fails."""
    max_concurrency: Annotated[int, Field(gt=0)] = 64
    """Most requests in flight at once (each asks for rollouts_per_example completions)."""
    api_key: ApiKey | None = Field(default=None, exclude=True)
    """The inference server's API key, sent as Authorization: Bearer <key>; set it as PRIME_CLIENT__API_KEY (rl hands it down). Never printed or written to configs/."""


class EnvConfig(BaseConfig):
    """One environment to sample prompts from (`[[orchestrator.env]]`, repeat to mix)."""

    id: str = "reverse-text"
    """Environment id: a built-in (reverse-text, alphabet-sort, arithmetic), 'pkg.module:Class', or a verifiers environment."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment (e.g. {min_len = 5, max_len = 12})."""
    weight: PositiveFloat = 1.0
    """Relative probability that a prompt is drawn from this environment."""
    name: str | None = None
    """Name in metrics (reward/<name>/...); default: the id. Must be unique."""
    score_timeout_s: PositiveFloat = 60.0
    """Longest one `score` (or `score_group`) call may take; past it the rollout fails (see on_error)."""
    respond_timeout_s: PositiveFloat = 60.0
    """Longest one `respond` call of a multi-turn environment (its reply to a policy turn, tool calls included) may
    take; past it the rollout fails (see on_error)."""
    max_turns: Annotated[int, Field(gt=0)] | None = None
    """Most policy turns per rollout of a multi-turn environment; none: the environment's own `max_turns`."""
    on_error: Literal["zero", "fail"] = "zero"
    """When an environment call (respond, score) raises or times out: zero: the rollout scores 0 and the run goes on
    (one warning line naming the example; rollout/env_error_frac); fail: the run stops with that error."""

    @property
    def metric_name(self) -> str:
        return self.name or self.id

    @model_validator(mode="after")
    def _loadable(self) -> EnvConfig:
        # Built-ins are cheap to build, so bad ids and args fail at config time (before `rl`
        # starts anything). Other ids go to `verifiers` and are checked when the run starts.
        if self.id in ENVIRONMENTS or ":" in self.id:
            try:
                env = load_env(self.id, **self.args)
            except UserError as exc:
                raise ValueError(str(exc)) from None
            if not env.multi_turn and self.max_turns not in (None, 1):
                raise ValueError(f"environment '{self.id}' is single-turn: max_turns = {self.max_turns} has no effect")
        elif importlib.util.find_spec("verifiers") is None:
            raise ValueError(
                f"unknown environment '{self.id}' (known: {', '.join(sorted(ENVIRONMENTS))}; "
                "other ids need the 'verifiers' extra installed)"
            )
        return self


MIN_TRAIN_TEMPERATURE = 1e-3


class SamplingConfig(BaseConfig):
    """Sampling parameters of training rollouts."""

    temperature: Annotated[float, Field(allow_inf_nan=True)] = 1.0  # inf/nan reach the validator, which says why not
    """Sampling temperature T, finite and >= 1e-3: the trainer scores tokens with log_softmax(logits / T), so T = 0 (greedy) cannot be trained on (use eval.temperature = 0 for greedy evaluation)."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling mass (keep 1.0 for RL: the trainer does not truncate)."""
    max_tokens: Annotated[int, Field(gt=0)] = 128
    """Most completion tokens per rollout."""

    @field_validator("temperature")
    @classmethod
    def _trainable_temperature(cls, value: float) -> float:
        # Not `value >= MIN` alone: NaN compares false both ways.
        if not (math.isfinite(value) and value >= MIN_TRAIN_TEMPERATURE):
            raise ValueError(
                f"training needs a finite temperature >= {MIN_TRAIN_TEMPERATURE:g} (the trainer divides logits by it); "
                "greedy decoding (0) is for eval.temperature only"
            )
        return value


class EvalConfig(BaseConfig):
    """Periodic evaluation on a fixed set of examples per environment."""

    interval: Annotated[int, Field(gt=0)] | None = None
    """Evaluate every this many steps (at steps 0, interval, ...); none: never."""
    num_examples: Annotated[int, Field(gt=0)] = 32
    """Examples per environment (the same ones every time)."""
    rollouts: Annotated[int, Field(gt=0)] = 1
    """Completions per example: k of pass@k."""
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    """Sampling temperature, finite; 0 is greedy decoding (argmax), allowed here because eval rollouts are never trained on."""
    success_threshold: Annotated[float, Field(ge=0, le=1)] = 1.0
    """A completion counts as solved for pass@k when its reward is at least this."""


class OrchestratorConfig(RunConfig):
    """Orchestrator: samples prompts, collects and scores rollouts, writes training batches."""

    command = "orchestrator"

    max_async_level: Annotated[int, Field(ge=0)] = 1
    """Rollouts of step n may use weights of step m only if n - m <= this (0: on-policy); per token in continuous mode."""
    rollout_mode: Literal["step", "continuous"] = "step"
    """step: each step generates its own batch, then waits for weights (reproducible given the weights).
    continuous: requests stay in flight across steps, batches fill with groups as they finish, and weight updates
    land between decode iterations without draining the server (builtin backend); see docs/async.md."""
    ckpt: CkptConfig = Field(default_factory=CkptConfig)
    """Checkpointing and resume."""
    client: ClientConfig = Field(default_factory=ClientConfig)
    """The inference server connection."""
    trainer_world_size: Annotated[int, Field(ge=1)] = 1
    """Number of trainer ranks: one batch file per rank (the `rl` launcher sets it)."""
    env: list[EnvConfig] = Field(default_factory=lambda: [EnvConfig()], min_length=1)
    """Environments to sample from ([[orchestrator.env]] tables)."""
    batch_size: Annotated[int, Field(gt=0)] = 64
    """Rollouts (samples) per step; batch_size / rollouts_per_example prompts."""
    rollouts_per_example: Annotated[int, Field(gt=0)] = 8
    """Completions per prompt (the group of group-relative advantages)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling of training rollouts."""
    advantage: AdvantageConfig = Field(default_factory=GrpoAdvantageConfig)
    """How rewards become advantages (see docs/orchestrator.md)."""
    normalize_advantages: bool = False
    """Whiten the final advantages over the whole batch: (A - mean) / (std + eps)."""
    filter_zero_advantage: bool = False
    """Drop groups whose advantages are all zero (they carry no learning signal)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop zero-advantage groups and draw more prompts until the batch is full again."""
    dynamic_sampling_max_rounds: Annotated[int, Field(ge=0)] = 4
    """Most extra sampling rounds per step under dynamic_sampling (then train on what there is); in continuous mode
    with filter_zero_advantage, a step looks at most at (1 + this) batches' worth of finished groups."""
    share_prompts: bool = True
    """Write a prompt's completions as one root (the prompt) and a branch per completion, so the trainer computes
    the prompt once (docs/architecture.md). `rl` turns it off when the trainer uses flash_attention_2, whose
    varlen kernel recomputes the prompt per completion: a row packed to seq_len would expand past it."""
    mask_truncated: bool = False
    """Exclude completions cut off by max_tokens from the loss (their loss_mask is false)."""
    truncated_reward: float | None = None
    """If set, the reward given to a truncated completion instead of its environment reward (a penalty)."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Periodic evaluation."""
    weights_timeout_s: PositiveFloat = 900.0
    """Longest to wait for the trainer's weights/step_N before failing."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by rollouts_per_example ({self.rollouts_per_example})"
            )
        if self.advantage.compares_rollouts and self.rollouts_per_example < 2:
            raise ValueError(
                f"advantage type '{self.advantage.type}' compares rollouts of one prompt: "
                "rollouts_per_example must be >= 2"
            )
        if self.rollout_mode == "continuous" and self.dynamic_sampling:
            raise ValueError("rollout_mode = 'continuous' refills the batch by itself: use filter_zero_advantage "
                             "instead of dynamic_sampling")
        names = [e.metric_name for e in self.env]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"environment names must be unique, repeated: {', '.join(duplicates)} (set env[].name)")
        return self

    def check_consistency(self, prefix: str = "") -> None:
        """sampling.max_tokens must leave room for a prompt (of at least one token) in the model's context:
        max_position_embeddings of its config.json, when the model is on this machine. No server serves more.

        Not checked against seq_len here: on its own the orchestrator cuts longer rollouts to seq_len (its
        server may allow more); under `rl`, where seq_len is also the server's context, rl checks that too.
        """
        max_tokens = self.sampling.max_tokens
        known = self.model.context_length()
        if known is not None and max_tokens >= known[0]:
            raise ValueError(f"{prefix}sampling.max_tokens = {max_tokens} leaves no room for a prompt in the model's "
                             f"context of {known[0]} tokens (max_position_embeddings in {known[1]})")

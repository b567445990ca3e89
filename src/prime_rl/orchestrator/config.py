"""Config of the `orchestrator` entrypoint."""

from __future__ import annotations

import importlib.util
import json
import math
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from prime_rl.configs.advantage import AdvantageConfig, GrpoAdvantageConfig
from prime_rl.configs.base import BaseConfig
from prime_rl.configs.model_info import context_length, vocabulary_mismatch
from prime_rl.configs.shared import ASYNC_LEVEL_DEFAULT, AsyncLevel, CkptConfig, ModelConfig, RunConfig
from prime_rl.configs.validators import ApiKey
from prime_rl.envs import ENVIRONMENTS, Environment, load_env
from prime_rl.inference.config import BACKENDS, resolved_backend
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.utils.errors import UserError
from prime_rl.utils.imports import import_object

PositiveFloat = Annotated[float, Field(gt=0)]


class ClientConfig(BaseConfig):
    """How the orchestrator talks to the inference server."""

    base_url: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = "http://127.0.0.1:8000/v1"
    """OpenAI API root of the inference server, or a list of several servers' (requests go to the least busy; a
    dead one is dropped with a warning: orchestrator/servers.py). The `rl` launcher sets it."""
    pool_connect_timeout_s: PositiveFloat = 5.0
    """With several servers: how long one may stay unreachable before it is dropped (one server: connect_timeout_s)."""
    timeout_s: PositiveFloat = 600.0
    """Longest one request (or weight update) may take before the run fails."""
    connect_timeout_s: PositiveFloat = 60.0
    """How long to keep retrying an unreachable server before the run fails."""
    max_concurrency: Annotated[int, Field(gt=0)] = 64
    """Most requests in flight at once (each asks for rollouts_per_example completions)."""
    api_key: ApiKey | None = Field(default=None, exclude=True)
    """The inference server's API key, sent as Authorization: Bearer <key>; set it as PRIME_CLIENT__API_KEY
    (rl hands it down). Never printed or written to configs/."""


    @property
    def urls(self) -> list[str]:
        """Every server's OpenAI API root."""
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)


class _Built:
    """The environment a config built and the (id, args) it was built from, kept beside the config: no part of the
    config's value (configs that differ only in it are equal), never copied deeply or pickled (a copy builds its
    own), and built again when the config's id or args are no longer those."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.env: Environment | None = None

    def __deepcopy__(self, memo: dict) -> _Built:
        return _Built()

    def __reduce__(self) -> tuple:
        return _Built, ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Built)

    __hash__ = None


class EnvConfig(BaseConfig):
    """One environment to sample prompts from (`[[orchestrator.env]]`, repeat to mix)."""

    _built: _Built = PrivateAttr(default_factory=_Built)

    id: str = "reverse-text"
    """Environment id: a built-in (reverse-text, alphabet-sort, arithmetic), 'pkg.module:Class', or a verifiers
    environment."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment (e.g. {min_len = 5, max_len = 12})."""
    weight: PositiveFloat = 1.0
    """Relative probability that a prompt is drawn from this environment."""
    name: str | None = None
    """Name in metrics (reward/<name>/...); default: the environment's `id` (for a class named by import path,
    its class attribute `id`, not the path). Must be unique."""
    score_timeout_s: PositiveFloat = 60.0
    """Longest one `score` (or `score_group`) call may take; past it the rollout fails (see on_error)."""
    respond_timeout_s: PositiveFloat = 60.0
    """Longest one `respond` call of a multi-turn environment (its reply to a policy turn, tool calls included) may
    take; past it the rollout fails (see on_error)."""
    max_turns: Annotated[int, Field(gt=0)] | None = None
    """Most policy turns per rollout of a multi-turn environment; none: the environment's own `max_turns`."""
    on_error: Literal["exclude", "zero", "fail"] = "exclude"
    """When a rollout fails (an environment call, respond or score, raises or times out; an agent that crashed; a
    token id the server should not have sampled): exclude: the rollout trains nothing and its group trains on the
    rollouts that succeeded, with the baseline over those (a group left with fewer than 2, for a group-relative
    type, does not train; rollout/excluded_frac, rollout/unusable_groups); zero: it scores 0 and trains as a wrong
    answer; fail: the run stops with that error. Each failure logs a warning line naming the example (sparsely) and
    counts in rollout/env_error_frac."""

    @property
    def metric_name(self) -> str:
        if self.name:
            return self.name
        if ":" in self.id:  # "pkg.module:Class": the class's own id reads better in metrics than its path
            cls = import_object(self.id)
            return getattr(cls, "id", None) or self.id
        return self.id

    def build(self) -> Environment:
        """Its environment, built by the first call and kept: the config's checks, the run's draws and its
        evaluation use the one environment."""
        key = json.dumps([self.id, self.args], sort_keys=True, default=repr)
        if self._built.key != key:
            self._built.env, self._built.key = load_env(self.id, **self.args), key
        return self._built.env

    @property
    def checkable(self) -> bool:
        """Whether its environment is built when the config is read (a built-in or a class by import path); a
        verifiers id is built when the run starts."""
        return self.id in ENVIRONMENTS or ":" in self.id

    @property
    def rollout_kind(self) -> str | None:
        """Its environment's rollout kind (`Environment.rollout_kind`), or None for a verifiers id (not built yet;
        single- or multi-turn, never an agent)."""
        return self.build().rollout_kind if self.checkable else None

    @model_validator(mode="after")
    def _loadable(self) -> EnvConfig:
        # Built-ins are cheap to build, so bad ids and args fail at config time (before `rl`
        # starts anything). Other ids go to `verifiers` and are checked when the run starts.
        if self.checkable:
            try:
                env = self.build()
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


def no_example_ids(name: str, every_env: bool) -> str:
    """The one line for a curriculum over environment `name`, which has no example ids."""
    fix = "name the environments that have them in curriculum.envs" if every_env else "leave it out of curriculum.envs"
    return (f"curriculum: environment '{name}' has no example ids (it generates its examples, so there is no finite "
            f"pool to weigh; the dataset environment's rows have ids): {fix}")


MIN_TRAIN_TEMPERATURE = 1e-3


class ReasoningConfig(BaseConfig):
    """Reasoning blocks in completions (`chat/reasoning.py`): a completion splits at `end_tag` into
    reasoning and answer; the environment scores the answer, and rollout/reasoning_chars_mean and
    rollout/unfinished_reasoning_frac are logged. A completion without the tags is all answer."""

    parser: Literal["think", "none"] = "think"
    """think: split at the tags below; none: the environment scores the whole completion text."""
    start_tag: str = "<think>"
    """Opens the reasoning (it may be in the generation prompt instead of the completion, as Qwen3's template
    puts it)."""
    end_tag: Annotated[str, Field(min_length=1)] = "</think>"
    """Closes the reasoning; the answer is what follows its last occurrence."""
    opened_by_prompt: bool = False
    """The chat template ends the generation prompt with start_tag (DeepSeek-R1, Qwen3's 2507 thinking models), so
    a completion without end_tag ran out of tokens while thinking: all reasoning, an empty answer. False (Qwen3,
    which samples <think> itself): such a completion is all answer unless it begins with start_tag."""


class SamplingConfig(BaseConfig):
    """Sampling parameters of training rollouts."""

    temperature: Annotated[float, Field(allow_inf_nan=True)] = 1.0  # inf/nan reach the validator, which says why not
    """Sampling temperature T, finite and >= 1e-3: the trainer scores tokens with log_softmax(logits / T), so
    T = 0 (greedy) cannot be trained on (use eval.temperature = 0 for greedy evaluation)."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: keep the smallest most-likely set with mass >= top_p (1: off). The trainer scores tokens
    under the same truncation, so the importance ratio stays exact (see docs/losses.md, "Truncated sampling")."""
    top_k: Annotated[int, Field(ge=-1)] = -1
    """Keep only the top_k most likely tokens (-1: off; 0 is refused, as it would mean nothing)."""
    min_p: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Keep only tokens with probability >= min_p * the most likely token's (0: off)."""
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

    @field_validator("top_k")
    @classmethod
    def _top_k_not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("top_k = 0 keeps no token: use -1 to turn top-k off, or a positive count")
        return value

    @property
    def rule(self) -> SamplingRule:
        """The distribution tokens are drawn from (the server samples it, the trainer scores it)."""
        return SamplingRule(self.temperature, self.top_k, self.top_p, self.min_p)


class SamplesConfig(BaseConfig):
    """The step's rollouts as JSON lines, `rollouts/step_N/samples.jsonl`, beside the trainer's batch (written with
    it, atomically; a resumed run rewrites the steps it regenerates): what the model wrote, for reading
    (docs/orchestrator.md#samples-on-disk)."""

    interval: Annotated[int, Field(ge=0)] = 1
    """Write them every `interval` steps (step % interval == 0); 0: never."""
    fraction: float = Field(default=1.0, gt=0, le=1)
    """Of each written step's groups, the first ceil(fraction x groups) (all rollouts of a group, together)."""
    max_mib: float = Field(default=16.0, gt=0)
    """At most this much per step: rollouts past it are left out (a last line says how many)."""
    console_rows: Annotated[int, Field(ge=0)] = 0
    """`rl` prints this many of each written step's rollouts as a table (prompt, completion, reward, advantage), cut
    to the terminal's width; 0: none."""
    wandb_interval: Annotated[int, Field(ge=0)] = 0
    """Log the written rollouts to W&B as a `samples` table every this many steps (a multiple of `interval`, so that
    the step wrote them); 0: never."""
    wandb_rows: Annotated[int, Field(ge=1)] = 64
    """Rows of each W&B table: the step's first rollouts, whole groups first."""

    @model_validator(mode="after")
    def _wandb_on_written_steps(self) -> SamplesConfig:
        if self.wandb_interval and (not self.interval or self.wandb_interval % self.interval):
            raise ValueError(f"wandb_interval = {self.wandb_interval} must be a multiple of interval = "
                             f"{self.interval}: the table shows the rollouts a step wrote")
        return self


class EvalConfig(BaseConfig):
    """Periodic evaluation on a fixed set of examples per environment."""

    interval: Annotated[int, Field(gt=0)] | None = None
    """Evaluate every this many steps (at steps 0, interval, ...); none: never."""
    num_examples: Annotated[int, Field(gt=0)] = 32
    """Examples per environment (the same ones every time)."""
    rollouts: Annotated[int, Field(gt=0)] = 1
    """Completions per example: k of pass@k."""
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    """Sampling temperature, finite; 0 is greedy decoding (argmax), allowed here because eval rollouts are never
    trained on."""
    success_threshold: Annotated[float, Field(ge=0, le=1)] = 1.0
    """A completion counts as solved for pass@k when its reward is at least this."""


class TeacherConfig(BaseConfig):
    """On-policy distillation (`[teacher]`): a teacher model, served by an inference server, scores the tokens of
    every trained sample; its logprobs go into the batch (`teacher_logprobs`) and into the per-token OPD advantage
    (docs/losses.md#on-policy-distillation)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The teacher model. Its tokenizer must be the policy's (token ids are scored as they are): a different
    vocabulary is refused at start when both models are on this machine."""
    backend: Literal[(*BACKENDS.names, "auto")] = "auto"  # type: ignore[valid-type]
    """Backend of the teacher server rl starts (its other options are inference's); vllm scores at temperature 1
    only (docs/inference.md#scoring-prompt-logprobs)."""
    base_url: str | None = None
    """OpenAI API root of a teacher server started elsewhere (then rl starts none); none: rl starts one (a second
    inference process on a free port) and sets this."""
    api_key: ApiKey | None = Field(default=None, exclude=True)
    """The teacher server's API key (Authorization: Bearer <key>); set it as PRIME_TEACHER__API_KEY. rl hands the
    run's key to a teacher server it starts. Never printed or written to configs/."""
    opd_coef: float = Field(default=1.0, ge=0)
    """Weight of the per-token OPD advantage teacher_t - lq_t (the negative reverse-KL estimate on the sampled
    token); 0: the teacher logprobs only reach the batch (for loss.teacher_tau and loss/teacher_kl)."""
    task_coef: float = Field(default=1.0, ge=0)
    """Weight of the task advantage A (from the rewards); 0: distillation alone."""
    temperature: Annotated[float, Field(ge=MIN_TRAIN_TEMPERATURE, allow_inf_nan=False)] | None = None
    """Temperature the teacher scores at: lt_t = log_softmax(z_teacher / this)[x_t]; below the sampling temperature the
    student is distilled towards a sharper teacher. None: the sampling temperature (the distribution sampled from)."""
    samples_per_request: Annotated[int, Field(ge=1, le=1024)] = 64
    """Samples scored per request to the teacher (`prompt` a list of token-id lists, which both backends take): the
    server prefills them together, and a step's scoring costs a few requests instead of one per sample
    (docs/benchmarks.md#teacher-scoring). Requests in flight: at most the client's max_concurrency."""
    opd_center: bool = False
    """Subtract the step's mean of teacher_t - lq_t over its trained tokens from every token's OPD term (a constant
    baseline, as Tinker's distillation does; slime's does not): same expected gradient, less variance."""

    @model_validator(mode="after")
    def _some_signal(self) -> TeacherConfig:
        if self.opd_coef == 0 and self.task_coef == 0:
            raise ValueError("teacher.opd_coef and teacher.task_coef are both 0: no advantage would be left")
        return self


class CurriculumConfig(BaseConfig):
    """Online curriculum (`[orchestrator.curriculum]`; docs/orchestrator.md#online-curriculum): the examples of
    environments with example ids (`Environment.example_pool`: the `dataset` environment's rows) are drawn by a
    weight their recent pass rate sets, so examples always solved (rate 1) or never solved (rate 0), whose groups
    teach nothing, come up less often. Its state is in the orchestrator's checkpoint: a resumed run (step mode)
    draws exactly what an uninterrupted one would."""

    envs: Annotated[list[str], Field(min_length=1)] | None = None
    """The environments it draws for, by name (env[].name, else the id); none: every environment. Each needs
    example ids (the `dataset` environment; an agent whose task has them): a generated environment (reverse-text,
    arithmetic, ...) has none, so leave it out here and it draws its stream as without a curriculum."""
    window: Annotated[int, Field(ge=1)] = 1
    """An example's pass rate is over its last `window` groups: the rollouts that passed / its rollouts (failed
    rollouts, which say how the environment fared, are left out)."""
    pass_threshold: Annotated[float, Field(allow_inf_nan=False)] = 1.0
    """A rollout passes when its reward is at least this."""
    easy_rate: Annotated[float, Field(ge=0, le=1)] = 1.0
    """An example whose pass rate is at least this is easy (solved)."""
    hard_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """An example whose pass rate is at most this is hard (unsolved); below easy_rate."""
    easy_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.2
    """Sampling weight of an easy example, relative to 1 for an example in between: an environment draws example i
    with probability weight_i / the sum of its pool's weights (every weight 0: uniformly). 0: an easy example is
    not drawn again (so its rate never changes)."""
    hard_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.2
    """Sampling weight of a hard example, relative to 1 for an example in between (0: not drawn again)."""
    unseen_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Sampling weight of an example with no scored rollout yet, relative to 1 for an example in between."""

    @model_validator(mode="after")
    def _rates_in_order(self) -> CurriculumConfig:
        if self.hard_rate >= self.easy_rate:
            raise ValueError(f"hard_rate = {self.hard_rate:g} must be below easy_rate = {self.easy_rate:g}: an example "
                             "cannot be easy and hard at once")
        return self


class OrchestratorConfig(RunConfig):
    """Orchestrator: samples prompts, collects and scores rollouts, writes training batches."""

    command = "orchestrator"
    run_lock = "shared"

    max_async_level: AsyncLevel = ASYNC_LEVEL_DEFAULT
    """Rollouts of step n may use weights of step m only if n - m <= this (0: on-policy); per token in continuous
    mode."""
    rollout_mode: Literal["step", "continuous"] = "step"
    """step: each step generates its own batch, then waits for weights (reproducible given the weights).
    continuous: requests stay in flight across steps, batches fill with groups as they finish, and weight updates
    land while requests run, without draining the server (builtin backend; vLLM >= 0.32, or any vLLM that can pause
    with inference.vllm.in_flight_kv = "resubmit"; LoRA adapters on vLLM); see docs/async.md."""
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
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Variables for the chat template, e.g. {enable_thinking = false} (Qwen3): sent with every chat request (the
    server renders the prompt: vLLM and the builtin server both take `chat_template_kwargs`) and used when
    multi-turn rollouts render the turns themselves. Give SFT the same (`data.chat_template_kwargs`)."""
    reasoning: ReasoningConfig = Field(default_factory=ReasoningConfig)
    """How a completion splits into reasoning and answer (`<think>` blocks): which part the reward scores."""
    samples: SamplesConfig = Field(default_factory=SamplesConfig)
    """The step's rollouts as readable JSON lines (`rollouts/step_N/samples.jsonl`)."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any]) -> dict[str, Any]:
        from prime_rl.chat.template_tokens import check_template_kwargs

        return check_template_kwargs(value)
    """Sampling of training rollouts."""
    advantage: AdvantageConfig = Field(default_factory=GrpoAdvantageConfig)
    """How rewards become advantages (see docs/orchestrator.md)."""
    normalize_advantages: bool = False
    """Whiten the final advantages over every sample of the batch (docs/orchestrator.md#advantages)."""
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
    teacher: TeacherConfig | None = None
    """On-policy distillation from a teacher model ([teacher] in an rl config); none: no teacher."""
    curriculum: CurriculumConfig | None = None
    """Online curriculum: draw the examples of environments with example ids by their recent pass rate
    ([orchestrator.curriculum]; docs/orchestrator.md#online-curriculum); none: every environment draws its stream."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.batch_size % self.rollouts_per_example:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by "
                f"rollouts_per_example ({self.rollouts_per_example})"
            )
        if self.advantage.compares_rollouts and self.rollouts_per_example < 2:
            raise ValueError(
                f"advantage type '{self.advantage.type}' compares rollouts of one prompt: "
                "rollouts_per_example must be >= 2"
            )
        if self.rollout_mode == "continuous" and self.dynamic_sampling:
            raise ValueError("rollout_mode = 'continuous' refills the batch by itself: use filter_zero_advantage "
                             "instead of dynamic_sampling")
        if self.teacher is not None and self.teacher.task_coef == 0 and (self.filter_zero_advantage
                                                                         or self.dynamic_sampling):
            raise ValueError("teacher.task_coef = 0 (distillation alone) with filter_zero_advantage or "
                             "dynamic_sampling would drop groups of equal rewards, which still carry the teacher's "
                             "signal")
        if self.advantage.computed_in == "trainer":  # the trainer computes these advantages; nothing here may read them
            clashing = [name for name in ("filter_zero_advantage", "dynamic_sampling", "normalize_advantages")
                        if getattr(self, name)] + (["teacher"] if self.teacher is not None else [])
            if clashing:
                raise ValueError(f"advantage type '{self.advantage.type}' is computed per token by the trainer: "
                                 f"{clashing[0]} needs the orchestrator's advantages (turn it off)")
        if self.advantage.trainer_step == "groups":  # the trainer recomputes them with the KL in the reward
            clashing = [name for name in ("normalize_advantages",) if getattr(self, name)] + (
                ["teacher"] if self.teacher is not None else [])
            if clashing:
                raise ValueError(f"advantage.reward_kl makes the trainer compute the '{self.advantage.type}' "
                                 f"advantages from rewards minus the KL: {clashing[0]} needs the orchestrator's "
                                 "(turn one of them off)")
        agents = [e for e in self.env if e.rollout_kind == "agent"]
        discounted = [e.metric_name for e in agents if e.build().turn_discount != 1]
        if discounted and (self.teacher is not None or self.advantage.computed_in == "trainer"):
            raise ValueError(f"environment '{discounted[0]}': turn_discount scales the orchestrator's advantage per "
                             "token, which a teacher's or a trainer-computed advantage replaces: leave it at 1")
        if self.advantage.trainer_step == "groups" and agents:
            raise ValueError("advantage.reward_kl recomputes each group from one sample per rollout, but an agent "
                             "rollout trains one sample per segment: turn reward_kl off for agent environments")
        names = [e.metric_name for e in self.env]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"environment names must be unique, repeated: {', '.join(duplicates)} (set env[].name)")
        if self.curriculum is not None:
            self._check_curriculum()
        return self

    def _check_curriculum(self) -> None:
        """The curriculum's environments exist and have example ids: a built-in or a class by import path is made
        and asked now; a verifiers id, which is made when the run starts, is asked then (the same one line)."""
        names = [e.metric_name for e in self.env]
        chosen = self.curriculum.envs
        unknown = [name for name in chosen or () if name not in names]
        if unknown:
            raise ValueError(f"curriculum.envs names no environment {unknown[0]!r} (environments: {', '.join(names)})")
        for env, name in zip(self.env, names, strict=True):
            if (chosen is None or name in chosen) and env.checkable and not env.build().example_pool():
                raise ValueError(no_example_ids(name, chosen is None))

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
        if self.teacher is not None:
            self._check_teacher(prefix)

    @property
    def teacher_temperature(self) -> float:
        """The temperature the teacher scores at: teacher.temperature, else the sampling temperature."""
        chosen = self.teacher.temperature if self.teacher is not None else None
        return chosen if chosen is not None else self.sampling.temperature

    def _check_teacher(self, prefix: str) -> None:
        """The teacher scores the policy's token ids: same vocabulary (when both models are here), room for a
        full-length completion (a prompt token, max_tokens, and the one token a scoring request generates), and
        a temperature the teacher's backend can score at."""
        teacher = self.teacher
        differ = vocabulary_mismatch(self.model.name, teacher.model.name, self.model.trust_remote_code
                                     or teacher.model.trust_remote_code)
        if differ:
            raise ValueError(f"{prefix}teacher.model {teacher.model.name!r} has another vocabulary than model "
                             f"{self.model.name!r} ({differ}): a teacher must share the policy's tokenizer")
        known = context_length(teacher.model.name)
        if known is not None and known[0] < self.sampling.max_tokens + 2:
            raise ValueError(f"{prefix}teacher.model's context of {known[0]} tokens ({known[1]}) cannot score a "
                             f"completion of sampling.max_tokens = {self.sampling.max_tokens} after a prompt")
        if teacher.base_url is None and resolved_backend(teacher.backend) == "vllm" and self.teacher_temperature != 1:
            raise ValueError(f"{prefix}teacher.backend = {teacher.backend!r} serves with vllm here, which scores at "
                             "temperature 1 only (vLLM's prompt logprobs are untempered), but the teacher would score "
                             f"at {self.teacher_temperature:g} (teacher.temperature, else sampling.temperature)")

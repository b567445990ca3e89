"""Config of the `sft` entrypoint (supervised warm-up; shares model/optim/ckpt code with the trainer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from prime_rl.configs.base import BaseConfig
from prime_rl.trainer.config import ModelInitConfig, OptimConfig, TrainingConfig, settle_init

if TYPE_CHECKING:
    from prime_rl.configs.layers import Layer


class SFTDataConfig(BaseConfig):
    """Where the supervised examples come from: a local data file or an environment (exactly one)."""

    path: Path | None = None
    """A data file or directory (JSONL, JSON, CSV, parquet: docs/environments.md, "Train on a data set"); each row
    has `messages` (chat) or `prompt` + `completion` (or `answer`), strings or message lists."""
    env: str | None = None
    """Environment id whose examples (prompt + reference answer) are the data, e.g. 'reverse-text'."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment (e.g. {min_len = 5, max_len = 12})."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Variables for the chat template, e.g. {enable_thinking = false} (Qwen3); the same as the orchestrator's, so a
    model is fine-tuned on the prompts RL will render."""

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict[str, Any]) -> dict[str, Any]:
        from prime_rl.chat.template_tokens import check_template_kwargs

        return check_template_kwargs(value)

    @model_validator(mode="after")
    def _one_source(self) -> SFTDataConfig:
        if (self.path is None) == (self.env is None):
            raise ValueError("set exactly one of data.path (a data file) or data.env (an environment id)")
        if self.env is not None:
            from prime_rl.envs import load_env
            from prime_rl.utils.errors import UserError

            try:  # unknown ids and bad arguments fail at config time, before the model loads
                load_env(self.env, **self.env_args)
            except UserError as exc:
                raise ValueError(str(exc)) from None
        return self


class SFTEvalConfig(BaseConfig):
    """Greedy evaluation on held-out environment examples (needs data.env)."""

    interval: Annotated[int, Field(ge=1)] | None = None
    """Evaluate every this many steps and at the end (none: never)."""
    num_examples: Annotated[int, Field(ge=1)] = 64
    """Examples per evaluation (drawn with a seed different from the training stream)."""
    max_new_tokens: Annotated[int, Field(ge=1)] = 32
    """Generation budget per example."""


class SFTConfig(TrainingConfig):
    """sft: supervised fine-tuning on chat data (loss on assistant tokens only)."""

    command = "sft"
    run_lock = "exclusive"

    data: SFTDataConfig = Field(default_factory=lambda: SFTDataConfig(env="reverse-text"))
    """Training data."""
    init: ModelInitConfig | None = None
    """Start from a randomly initialised architecture instead of model.name's weights (no download). Of model.name
    and [init] the one set in the later layer wins, with a one-line notice (`--model.name DIR` drops a file's
    [init]); both in one layer are an error. `--init none` turns it off."""
    batch_size: Annotated[int, Field(ge=1)] = 64
    """Samples per optimizer step (over all ranks), packed into rows of at most seq_len tokens."""
    micro_batch_rows: Annotated[int, Field(ge=1)] = 16
    """Packed rows per forward/backward (more is faster on small models, uses more memory)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-3))
    """Optimizer (sft's default lr is 1e-3)."""
    weights_interval: Annotated[int, Field(ge=1)] | None = None
    """Write weights/step_N every this many steps (always at the end); none: only at the end."""
    eval: SFTEvalConfig = Field(default_factory=SFTEvalConfig)
    """Optional greedy evaluation (metric eval/reward)."""

    @classmethod
    def settle_layers(cls, layers: Sequence[Layer]) -> tuple[dict[str, Any], list[str]]:
        return settle_init(layers)

    @model_serializer(mode="wrap")
    def _without_unused_name(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """With [init] model.name is unused: --dry-run and configs/sft.toml leave it out, so the file loads back
        (one file setting both is an error, `settle_init`)."""
        data = handler(self)
        if self.init is not None and isinstance(data.get("model"), dict):
            data["model"].pop("name", None)
        return data

    @model_validator(mode="after")
    def _eval_needs_env(self) -> SFTConfig:
        if self.eval.interval is not None and self.data.env is None:
            raise ValueError("eval.interval needs data.env (evaluation scores greedy answers with the environment)")
        return self

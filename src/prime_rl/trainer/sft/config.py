"""Config of the `sft` entrypoint (supervised warm-up; shares model/optim/ckpt code with the trainer)."""

from __future__ import annotations

from pydantic import Field

from prime_rl.configs.shared import CkptConfig, RunConfig
from prime_rl.trainer.config import OptimConfig, SchedulerConfig, TrainerModelOptions


class SFTConfig(RunConfig):
    """sft: supervised fine-tuning on chat data (loss on assistant tokens only)."""

    command = "sft"

    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """Learning-rate schedule."""
    ckpt: CkptConfig = Field(default_factory=CkptConfig)
    """Checkpointing and resume."""
    runtime: TrainerModelOptions = Field(default_factory=TrainerModelOptions)
    """dtype, attention kernel, activation checkpointing, compile."""

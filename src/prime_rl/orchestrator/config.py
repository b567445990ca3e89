"""Config of the `orchestrator` entrypoint."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from prime_rl.configs.shared import CkptConfig, RunConfig


class OrchestratorConfig(RunConfig):
    """Orchestrator: samples prompts, collects and scores rollouts, writes training batches."""

    command = "orchestrator"

    max_async_level: Annotated[int, Field(ge=0)] = 1
    """Rollouts of step n may use weights of step m only if n - m <= this (0: on-policy)."""
    ckpt: CkptConfig = Field(default_factory=CkptConfig)
    """Checkpointing and resume."""

"""Config of the `inference` entrypoint."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from prime_rl.configs.base import EntrypointConfig
from prime_rl.configs.shared import ModelConfig


class InferenceConfig(EntrypointConfig):
    """Inference server: an OpenAI-compatible API with live weight updates."""

    command = "inference"

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model served."""
    seq_len: Annotated[int, Field(gt=0)] = 2048
    """Longest prompt + completion the server accepts, in tokens."""
    seed: int = 0
    """Seed for sampling."""
    backend: Literal["builtin", "vllm", "auto"] = "auto"
    """builtin (torch), vllm, or auto (vllm when importable and a GPU is present)."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    """Port to bind (0: any free port)."""

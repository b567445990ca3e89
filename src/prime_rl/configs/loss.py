"""`[loss]`: a discriminated union on `type`, one pydantic model per loss variant.

The math of each variant lives in `prime_rl.trainer.rl.loss`; see docs/losses.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from prime_rl.configs.base import BaseConfig

Normalization = Literal["token", "sequence", "token_local", "constant"]


class DefaultLossConfig(BaseConfig):
    """AIPO: masked importance sampling (prime-rl's default)."""

    type: Literal["default"] = "default"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""


class CustomLossConfig(BaseConfig):
    """A user-supplied loss function, imported by path."""

    type: Literal["custom"] = "custom"
    import_path: str
    """'pkg.module:function' or 'pkg.module.function'."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the function."""
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""


LossConfig = Annotated[DefaultLossConfig | CustomLossConfig, Field(discriminator="type")]

"""`[orchestrator.advantage]`: a discriminated union on `type`, one pydantic model per advantage type.

Every type is registered in `ADVANTAGES` (`@ADVANTAGES.config`); its function, in
`prime_rl.orchestrator.advantage`, registers with `@ADVANTAGES.implements(ItsConfig)` and is
called as `fn(rewards, **fields)` with the config's fields other than `type`. See
docs/orchestrator.md for the formulas.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from prime_rl.configs.base import BaseConfig
from prime_rl.configs.registry import Registry
from prime_rl.utils.imports import import_callable

ADVANTAGES: Registry[Any] = Registry("advantage", implemented_in="prime_rl.orchestrator.advantage")


class _AdvantageBase(BaseConfig):
    compares_rollouts: ClassVar[bool] = True
    """True for a group-relative type: it compares the rollouts of one prompt, so it needs at least 2 of them."""
    token_level: ClassVar[bool] = False
    """True for a type the trainer computes per token (`trainer/rl/token_advantage.py`): the orchestrator sends
    each sample's reward (the batch's `rewards`) instead of an advantage."""

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the implementation: every field but `type` (and a group type's KL fields,
        which the trainer applies)."""
        skip = {"type"} if self.token_level else {"type", "kl_in_reward", "kl_coef"}
        return {name: getattr(self, name) for name in type(self).model_fields if name not in skip}

    @property
    def group_kl(self) -> bool:
        """A group type with `kl_in_reward`: the trainer recomputes its advantages from each sample's reward minus
        its KL to the reference (`trainer/rl/group_kl.py`); the orchestrator sends rewards and groups."""
        return not self.token_level and getattr(self, "kl_in_reward", None) is not None


class _GroupKl(_AdvantageBase):
    """The KL-in-reward option of the group types (verl's `use_kl_in_reward`)."""

    kl_in_reward: Literal["k1", "k3"] | None = None
    """Fold the KL to the reference model (model.name, frozen) into each sample's reward before the group
    comparison: r_i - kl_coef * sum_t KL_t over its trained tokens (k1 = lq - lref, k3 = exp(lref - lq) -
    (lref - lq) - 1; lq: the sampler's logprob). The trainer computes these advantages (it has the reference
    model); none: the orchestrator's, from the rewards alone."""
    kl_coef: float = Field(default=0.01, ge=0)
    """Weight of the KL in the reward (with kl_in_reward)."""


@ADVANTAGES.config
class GrpoAdvantageConfig(_GroupKl):
    """GRPO: A_i = (r_i - mean(r)) / (std(r) + eps) within each group (sample std)."""

    type: Literal["grpo"] = "grpo"
    std_normalize: bool = True
    """Divide by the group's standard deviation (false: Dr. GRPO's plain r - mean)."""


@ADVANTAGES.config
class DrGrpoAdvantageConfig(_GroupKl):
    """Dr. GRPO: A_i = r_i - mean(r) within each group."""

    type: Literal["dr_grpo"] = "dr_grpo"


@ADVANTAGES.config
class RlooAdvantageConfig(_GroupKl):
    """RLOO: A_i = r_i - mean_{j != i} r_j (leave-one-out baseline) within each group."""

    type: Literal["rloo"] = "rloo"


@ADVANTAGES.config
class RppBaselineAdvantageConfig(_GroupKl):
    """REINFORCE++-baseline: a_i = r_i - mean(r) within each group, then whitened over the whole batch."""

    type: Literal["reinforce_plus_plus_baseline"] = "reinforce_plus_plus_baseline"


@ADVANTAGES.config
class ReinforcePlusPlusAdvantageConfig(_AdvantageBase):
    """Token-level REINFORCE++: per-token rewards r_t (the sample's reward on its last token, minus
    kl_coef * KL_t on every token with `kl_in_reward`), discounted returns G_t = sum_{k>=t} gamma^(k-t) r_k,
    whitened over every trained token of the batch. Computed by the trainer."""

    type: Literal["reinforce_plus_plus"] = "reinforce_plus_plus"
    compares_rollouts: ClassVar[bool] = False
    token_level: ClassVar[bool] = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per token."""
    kl_in_reward: Literal["k1", "k3"] | None = None
    """Fold the KL to the reference model (model.name, frozen) into the per-token reward: k1 = lq - lref,
    k3 = exp(lref - lq) - (lref - lq) - 1 (lq: the sampler's logprob); none: no KL term."""
    kl_coef: float = Field(default=0.01, ge=0)
    """Weight of the KL in the reward (with kl_in_reward)."""


@ADVANTAGES.config
class GaeAdvantageConfig(_AdvantageBase):
    """PPO's GAE with a learned critic ([trainer.critic]): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = sum_l (gamma lam)^l delta_{t+l}, optionally whitened over the batch. Computed by the trainer."""

    type: Literal["gae"] = "gae"
    compares_rollouts: ClassVar[bool] = False
    token_level: ClassVar[bool] = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per token."""
    lam: float = Field(default=0.95, ge=0, le=1)
    """GAE's lambda: 0 is the one-step TD advantage, 1 the Monte-Carlo return minus V_t."""
    whiten: bool = True
    """Whiten the advantages over every trained token of the batch: (A - mean) / (std + eps)."""
    kl_in_reward: Literal["k1", "k3"] | None = None
    """As for reinforce_plus_plus: the KL to the reference model folded into the per-token reward."""
    kl_coef: float = Field(default=0.01, ge=0)
    """Weight of the KL in the reward (with kl_in_reward)."""


@ADVANTAGES.config
class CustomAdvantageConfig(_AdvantageBase):
    """A user function fn(rewards [groups, rollouts], **kwargs) -> advantages [groups, rollouts]."""

    type: Literal["custom"] = "custom"
    compares_rollouts: ClassVar[bool] = False
    import_path: str
    """'pkg.module:function' or 'pkg.module.function'."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the function."""

    @field_validator("import_path")
    @classmethod
    def _importable(cls, value: str) -> str:
        import_callable(value)  # same import rules (and errors) as custom losses
        return value


AdvantageConfig = ADVANTAGES.union()
"""The `[orchestrator.advantage]` section: one of the registered types, selected by `type`."""

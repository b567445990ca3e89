"""`[orchestrator.advantage]`: a discriminated union on `type`, one pydantic model per advantage type.

Every type is registered in `ADVANTAGES` (`@ADVANTAGES.config`) and says where it is computed
(`computed_in`); its function, in `prime_rl.advantages`, registers with `@ADVANTAGES.implements(ItsConfig)`
and is called with the config's `arguments()` (every field but `type` and the options the framework
applies itself: `kl_in_reward`, `kl_coef`, and a trainer-computed type's `whiten`):

    computed_in = "orchestrator"   fn(rewards, **arguments) -> advantages
                                   rewards [groups, rollouts] float64 (row g: the rollouts of one prompt),
                                   advantages the same shape; the sample's advantage on its trained tokens
    computed_in = "trainer"        fn(row: TokenRow, **arguments) -> A [T] float64, 0 off the mask
                                   one packed row of the batch (`prime_rl.advantages.token.TokenRow`: per-token
                                   rewards r_t, the critic's V_t, the loss mask, the segment lengths), before
                                   the update epochs; whitened over the step when the config's `whiten` is true

See docs/orchestrator.md#advantages for the formulas.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from prime_rl.configs.base import BaseConfig
from prime_rl.configs.extensions import Registry
from prime_rl.utils.imports import import_callable

ADVANTAGES: Registry[Any] = Registry("advantage", implemented_in="prime_rl.advantages")

ComputedIn = Literal["orchestrator", "trainer"]

FRAMEWORK_OPTIONS = frozenset({"type", "kl_in_reward", "kl_coef"})
"""Fields the framework applies around a type's function, never passed to it: the type and the KL folded into the
reward (the trainer, which has the reference model); of a trainer-computed type also `whiten` (the trainer whitens
its A over the step). A group type's own field of that name is its own."""


class AdvantageBase(BaseConfig):
    """The base of every advantage config (a type defined outside prime-rl subclasses it too)."""

    computed_in: ClassVar[ComputedIn] = "orchestrator"
    """Where the type's function runs: "orchestrator" from the rewards of each prompt's group (the batch carries
    the advantages), "trainer" per token from the batch's `rewards` (it needs per-token values only the trainer
    has: the critic's V_t, the reference's logprobs); the orchestrator then writes advantages of 0."""
    compares_rollouts: ClassVar[bool] = True
    """True for a group-relative type: it compares the rollouts of one prompt, so it needs at least 2 of them."""

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of the implementation: every field but `FRAMEWORK_OPTIONS` (and a trainer-computed
        type's `whiten`)."""
        skip = FRAMEWORK_OPTIONS | ({"whiten"} if self.computed_in == "trainer" else set())
        return {name: getattr(self, name) for name in type(self).model_fields if name not in skip}

    def function(self) -> Callable[..., Any]:
        """The registered implementation of this type with `arguments()` bound (module docstring)."""
        return functools.partial(ADVANTAGES.implementation(self.type), **self.arguments())

    @property
    def whitened(self) -> bool:
        """A trainer-computed type: the trainer whitens its A over every trained token of the step (the `whiten`
        field or class attribute; none: no)."""
        return bool(getattr(self, "whiten", False))

    @property
    def group_kl(self) -> bool:
        """An orchestrator-computed type with `kl_in_reward`: the trainer recomputes its advantages from each
        sample's reward minus its KL to the reference (`prime_rl.advantages.kl`); the orchestrator sends rewards
        and groups."""
        return self.computed_in == "orchestrator" and getattr(self, "kl_in_reward", None) is not None


class _GroupKl(AdvantageBase):
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
class ReinforcePlusPlusAdvantageConfig(AdvantageBase):
    """Token-level REINFORCE++: per-token rewards r_t (the sample's reward on its last token, minus
    kl_coef * KL_t on every token with `kl_in_reward`), discounted returns G_t = sum_{k>=t} gamma^(k-t) r_k,
    whitened over every trained token of the batch. Computed by the trainer."""

    type: Literal["reinforce_plus_plus"] = "reinforce_plus_plus"
    computed_in: ClassVar[ComputedIn] = "trainer"
    compares_rollouts: ClassVar[bool] = False
    whiten: ClassVar[bool] = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per token."""
    kl_in_reward: Literal["k1", "k3"] | None = None
    """Fold the KL to the reference model (model.name, frozen) into the per-token reward: k1 = lq - lref,
    k3 = exp(lref - lq) - (lref - lq) - 1 (lq: the sampler's logprob); none: no KL term."""
    kl_coef: float = Field(default=0.01, ge=0)
    """Weight of the KL in the reward (with kl_in_reward)."""


@ADVANTAGES.config
class GaeAdvantageConfig(AdvantageBase):
    """PPO's GAE with a learned critic ([trainer.critic]): delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = sum_l (gamma lam)^l delta_{t+l}, optionally whitened over the batch. Computed by the trainer."""

    type: Literal["gae"] = "gae"
    computed_in: ClassVar[ComputedIn] = "trainer"
    compares_rollouts: ClassVar[bool] = False
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
class CustomAdvantageConfig(AdvantageBase):
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

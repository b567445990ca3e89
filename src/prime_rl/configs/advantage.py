"""`[orchestrator.advantage]`: a discriminated union on `type`, one pydantic model per advantage type.

Every type is registered in `ADVANTAGES` (`@ADVANTAGES.config`) and says where it is computed
(`computed_in`); its function, in `prime_rl.advantages`, registers with `@ADVANTAGES.implements(ItsConfig)`
and is called with the config's `arguments()` (every field but `type` and the options the framework
applies itself: `reward_kl`, and a trainer-computed type's `whiten`):

    computed_in = "orchestrator"   fn(rewards, **arguments) -> advantages
                                   rewards [groups, rollouts] float64 (row g: the rollouts of one prompt),
                                   advantages the same shape; the sample's advantage on its trained tokens
    computed_in = "trainer"        fn(row: TokenRow, **arguments) -> A [T] float64, 0 off the mask
                                   one packed row of the batch (`prime_rl.advantages.token.TokenRow`: per-token
                                   rewards r_t, the critic's V_t, the loss mask, the segment lengths), before
                                   the update epochs; whitened over the step when the config's `whiten` is true

The config is the run's one advantage plan: the orchestrator and the trainer read what each does from it alone
(`trainer_step`, `batch_fields`, `uses_critic`), and the filters that judge groups by their advantages refuse a
type whose advantages only the trainer knows (`OrchestratorConfig`). The pipeline from a reward to the loss's
advantage and the group types' formulas: docs/orchestrator.md#advantages; the trainer-computed types' and the KL in
the reward: docs/losses.md#token-level-advantages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from prime_rl.configs.base import BaseConfig
from prime_rl.configs.extensions import Registry
from prime_rl.utils.imports import import_callable

ADVANTAGES: Registry[Any] = Registry("advantage", implemented_in="prime_rl.advantages", default="grpo")

ComputedIn = Literal["orchestrator", "trainer"]
TrainerStep = Literal["tokens", "groups"] | None

FRAMEWORK_OPTIONS = frozenset({"type", "reward_kl"})
"""Fields the framework applies around a type's function, never passed to it: the type and the KL folded into the
reward (the trainer, which has the reference model); of a trainer-computed type also `whiten` (the trainer whitens
its A over the step). A group type's own field of that name is its own."""

RENAMED = {"kl_in_reward": "reward_kl.estimator", "kl_coef": "reward_kl.coef"}
"""Keys of earlier versions: the KL in the reward is its own section, named apart from the loss's `kl_coef`."""


class RewardKlConfig(BaseConfig):
    """`[orchestrator.advantage.reward_kl]`: the KL to the reference model (model.name, frozen) folded into the
    reward before the advantage (verl's `use_kl_in_reward`). Not the loss's KL regularizer (`loss.kl_coef`), which
    adds a KL term to the loss instead. The formulas: docs/losses.md#token-level-advantages."""

    estimator: Literal["k1", "k3"] = "k1"
    """The per-token estimate of the KL between the sampler and the reference model
    (docs/losses.md#token-level-advantages)."""
    coef: float = Field(default=0.01, ge=0)
    """Weight of the KL subtracted from the reward."""


class AdvantageBase(BaseConfig):
    """The base of every advantage config (a function outside prime-rl is a `custom` type's `import_path`)."""

    computed_in: ClassVar[ComputedIn] = "orchestrator"
    """Where the type's function runs: "orchestrator" from the rewards of each prompt's group (the batch carries
    the advantages), "trainer" per token from the batch's `rewards` (it needs per-token values only the trainer
    has: the critic's V_t, the reference's logprobs); the orchestrator then writes advantages of 0."""
    compares_rollouts: ClassVar[bool] = True
    """True for a group-relative type: it compares the rollouts of one prompt, so it needs at least 2 of them."""
    uses_critic: ClassVar[bool] = False
    """The trainer trains a critic V for this type (`[trainer.critic]`) and gives its function V_t."""
    batch_whitened: ClassVar[bool] = False
    """An orchestrator-computed type whose last step is whitening over the batch (REINFORCE++-baseline): its function
    gives the values before it, and the framework whitens them over every trained sample (`advantages.group`)."""

    reward_kl: RewardKlConfig | None = None
    """Fold the KL to the reference model into the reward before this type's advantage (`RewardKlConfig`); the
    trainer then computes the advantages (it has the reference model). none: the rewards alone."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        old = [key for key in RENAMED if key in data and key not in cls.model_fields] if isinstance(data, dict) else []
        if old:
            renames = ", ".join(f"{key} is now {RENAMED[key]}" for key in old)
            raise ValueError(f"{renames} (the KL in the reward has its own section, [orchestrator.advantage."
                             "reward_kl], named apart from loss.kl_coef, the loss's regularizer)")
        return data

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
    def trainer_step(self) -> TrainerStep:
        """What the trainer does to the batch before the loss: "tokens" computes a trainer-computed type's
        advantages per token; "groups" recomputes an orchestrator-computed type's from each sample's reward minus
        its KL (`reward_kl`, `prime_rl.advantages.kl`); None trains on the advantages the orchestrator wrote."""
        if self.computed_in == "trainer":
            return "tokens"
        return "groups" if self.reward_kl is not None else None

    @property
    def batch_fields(self) -> tuple[str, ...]:
        """The optional batch fields (`batch_format`) the orchestrator writes for the trainer's step: each token's
        reward for "tokens", each segment's group and reward for "groups"."""
        return {"tokens": ("rewards",), "groups": ("sample_groups",), None: ()}[self.trainer_step]


@ADVANTAGES.config
class GrpoAdvantageConfig(AdvantageBase):
    """GRPO: each group's rewards centered and divided by their standard deviation (docs/orchestrator.md#advantages)."""

    type: Literal["grpo"] = "grpo"
    std_normalize: bool = True
    """Divide by the group's standard deviation (false: Dr. GRPO's plain r - mean)."""


@ADVANTAGES.config
class DrGrpoAdvantageConfig(AdvantageBase):
    """Dr. GRPO: each group's rewards centered, no std division."""

    type: Literal["dr_grpo"] = "dr_grpo"


@ADVANTAGES.config
class RlooAdvantageConfig(AdvantageBase):
    """RLOO: a leave-one-out baseline within each group."""

    type: Literal["rloo"] = "rloo"


@ADVANTAGES.config
class RppBaselineAdvantageConfig(AdvantageBase):
    """REINFORCE++-baseline: each group's rewards centered, then whitened over the whole batch."""

    type: Literal["reinforce_plus_plus_baseline"] = "reinforce_plus_plus_baseline"
    batch_whitened: ClassVar[bool] = True


@ADVANTAGES.config
class ReinforcePlusPlusAdvantageConfig(AdvantageBase):
    """Token-level REINFORCE++: the discounted return of per-token rewards (the sample's reward on its last token,
    minus the KL on every token with `reward_kl`), whitened over every trained token of the batch. Computed by the
    trainer (docs/losses.md#token-level-reinforce)."""

    type: Literal["reinforce_plus_plus"] = "reinforce_plus_plus"
    computed_in: ClassVar[ComputedIn] = "trainer"
    compares_rollouts: ClassVar[bool] = False
    whiten: ClassVar[bool] = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per token."""


@ADVANTAGES.config
class GaeAdvantageConfig(AdvantageBase):
    """PPO's GAE with a learned critic ([trainer.critic]), optionally whitened over the batch. Computed by the
    trainer (docs/losses.md#ppo-with-a-critic-gae)."""

    type: Literal["gae"] = "gae"
    computed_in: ClassVar[ComputedIn] = "trainer"
    compares_rollouts: ClassVar[bool] = False
    uses_critic: ClassVar[bool] = True
    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount per token."""
    lam: float = Field(default=0.95, ge=0, le=1)
    """GAE's lambda: 0 is the one-step TD advantage, 1 the Monte-Carlo return minus V_t."""
    whiten: bool = True
    """Whiten the advantages over every trained token of the batch (docs/losses.md#token-level-advantages)."""


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

"""`[loss]`: a discriminated union on `type`, one pydantic model per loss variant.

Every variant is registered in `LOSSES` (`@LOSSES.config`); its function, in
`prime_rl.trainer.rl.losses`, registers with `@LOSSES.implements(ItsConfig)`, and `LossConfig`
is the union of the registered classes. The formulas, defaults and papers: docs/losses.md (their one home).
Every variant has a `normalization` (with its own default), an optional KL-to-reference term
(`kl_coef`, `kl_type`) and an entropy bonus (`entropy_coef`).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from prime_rl.configs.base import BaseConfig
from prime_rl.configs.extensions import Registry
from prime_rl.utils.imports import import_callable

LOSSES: Registry[Any] = Registry("loss", implemented_in="prime_rl.trainer.rl.losses", default="default")

Normalization = Literal["token", "sequence", "token_local", "constant"]
KLType = Literal["k1", "k2", "k3", "low_var_kl"]


class _LossCommon(BaseConfig):
    """Keys every loss type accepts."""

    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL-to-reference penalty (needs `ref_logprobs` in the batch when > 0)."""
    kl_type: KLType = "k3"
    """Per-token estimator of the KL penalty, on d = lp - ref: k1, k2, k3 (finite for every finite d) or low_var_kl
    (clamped); docs/losses.md#regularizers-every-type."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus, subtracted from every token's loss (needs entropies from the trainer)."""

    needs_log_ratio_moments: ClassVar[bool] = False
    """True for a variant whose loss depends on a statistic of the whole step (`LossScale.log_ratio_moments`)."""


def _check_low_high(config: BaseConfig, *pairs: tuple[str, str]) -> None:
    for low, high in pairs:
        lo, hi = getattr(config, low), getattr(config, high)
        if not lo < hi:
            raise ValueError(f"{low} ({lo}) must be smaller than {high} ({hi})")


class _AdvantageShaping(BaseConfig):
    """The weights of the shaped advantage Â of `default` and `sapo`
    (docs/losses.md#default--masked-importance-sampling-aipo-prime-rls-default)."""

    adv_tau: float = 1.0
    """Weight of the advantage A in the shaped advantage Â."""
    teacher_tau: float = Field(default=0.0, ge=0)
    """Weight of the teacher term in Â, the teacher's logprob minus the trainer's (needs `teacher_logprobs` if > 0)."""
    kl_tau: float = Field(default=0.0, ge=0)
    """Weight of the inference-mismatch penalty, the log ratio subtracted from Â."""


@LOSSES.config
class DefaultLossConfig(_LossCommon, _AdvantageShaping):
    """AIPO: masked importance sampling (prime-rl's default)."""

    type: Literal["default"] = "default"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    ratio_type: Literal["token", "sequence"] = "token"
    """Importance weight: per-token r, or the sample's capped sequence ratio (docs/losses.md, `default`)."""
    token_mask_low: float = Field(default=0.125, ge=0)
    """Mask a token whose ratio r is below this."""
    token_mask_high: float = Field(default=8.0, gt=0)
    """Mask a token whose ratio r is above this."""
    geo_mask_low: float = Field(default=0.1, ge=0)
    """Mask a whole sample whose geometric-mean ratio is below this."""
    geo_mask_high: float = Field(default=10.0, gt=0)
    """Mask a whole sample whose geometric-mean ratio is above this."""
    sequence_mask_low: float = Field(default=0.0, ge=0)
    """Mask a whole sample if any of its tokens has a ratio below this."""
    sequence_mask_high: float = Field(default=100.0, gt=0)
    """Mask a whole sample if any of its tokens has a ratio above this."""
    sequence_clip_high: float = Field(default=10.0, gt=0)
    """Upper bound on the sequence ratio when ratio_type = 'sequence'."""

    @model_validator(mode="after")
    def _bounds(self) -> DefaultLossConfig:
        _check_low_high(
            self,
            ("token_mask_low", "token_mask_high"),
            ("geo_mask_low", "geo_mask_high"),
            ("sequence_mask_low", "sequence_mask_high"),
        )
        return self


@LOSSES.config
class SapoLossConfig(_LossCommon, _AdvantageShaping):
    """SAPO: soft adaptive policy optimization, a sigmoid gate instead of a hard clip (arXiv 2511.20347)."""

    type: Literal["sapo"] = "sapo"
    normalization: Normalization = "sequence"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    tau_pos: float = Field(default=1.0, gt=0)
    """Gate temperature for tokens with positive shaped advantage."""
    tau_neg: float = Field(default=1.05, gt=0)
    """Gate temperature for tokens with non-positive shaped advantage (the paper keeps it >= tau_pos)."""

    @model_validator(mode="after")
    def _warn_tau(self) -> SapoLossConfig:
        if self.tau_neg < self.tau_pos:
            warnings.warn(
                f"sapo: tau_neg ({self.tau_neg}) < tau_pos ({self.tau_pos}); the paper uses tau_neg >= tau_pos "
                "so that negative-advantage gradients decay faster",
                UserWarning,
                stacklevel=2,
            )
        return self


@LOSSES.config
class CispoLossConfig(_LossCommon):
    """CISPO (MiniMax-M1): clipped, stop-gradient importance weight on every token's policy gradient."""

    type: Literal["cispo"] = "cispo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    eps_high: float = Field(default=5.0, gt=0)
    """The weight is clipped at 1 + eps_high."""
    eps_low: float | None = Field(default=None, ge=0)
    """The weight is clipped at 1 - eps_low; None = no lower bound."""


@LOSSES.config
class DppoLossConfig(_LossCommon):
    """Upstream prime-rl's default objective: DPPO-Binary TV's trust region on the probability difference, by the
    advantage's sign, plus a squared-log-ratio KL term (docs/losses.md#dppo--upstream-prime-rls-default)."""

    type: Literal["dppo"] = "dppo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    mask_low: float = Field(default=0.2, ge=0)
    """A token with advantage <= 0 is masked when its probability fell by more than this (p_trainer - p_sampler <
    -mask_low)."""
    mask_high: float = Field(default=0.2, ge=0)
    """A token with advantage > 0 is masked when its probability rose by more than this."""
    adv_tau: float = Field(default=1.0, ge=0)
    """Weight of the advantage term."""
    kl_tau: float = Field(default=1e-3, ge=0)
    """Weight of the (log r)^2 term on every trained token, masked or not."""


@LOSSES.config
class VanillaLossConfig(_LossCommon):
    """Plain importance-sampled policy gradient, no clipping."""

    type: Literal["vanilla"] = "vanilla"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""


class PPOClipConfig(_LossCommon):
    """The keys of the clipped PPO surrogate, shared by grpo, bnpo, dr_grpo, dapo and fipo
    (docs/losses.md#grpo-bnpo-dr_grpo-dapo--the-clipped-ppo-surrogate)."""

    eps_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip bound 1 - eps_low."""
    eps_high: float = Field(default=0.2, ge=0)
    """Upper clip bound 1 + eps_high."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip: caps the loss of a negative-advantage token at this multiple of |A| (None = off; must be > 1)."""
    opsm_delta: float | None = Field(default=None, ge=0)
    """Off-policy sequence masking: drop the negative-advantage tokens of a sample that drifted from the sampler by
    more than this (the mean of lq - lp over its tokens, nats; None = off)."""


@LOSSES.config
class GrpoLossConfig(PPOClipConfig):
    """GRPO: the clipped surrogate, `sequence` normalization (arXiv 2402.03300)."""

    type: Literal["grpo"] = "grpo"
    normalization: Normalization = "sequence"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""


@LOSSES.config
class BnpoLossConfig(PPOClipConfig):
    """`bnpo`: the clipped surrogate, `token` normalization (TRL's `loss_type = "bnpo"`)."""

    type: Literal["bnpo"] = "bnpo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""


@LOSSES.config
class DrGrpoLossConfig(PPOClipConfig):
    """Dr. GRPO: the clipped surrogate, `constant` normalization (arXiv 2503.20783)."""

    type: Literal["dr_grpo"] = "dr_grpo"
    normalization: Normalization = "constant"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""


@LOSSES.config
class DapoLossConfig(PPOClipConfig):
    """DAPO: the clipped surrogate with clip-higher, `token` normalization (arXiv 2503.14476)."""

    type: Literal["dapo"] = "dapo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    eps_high: float = Field(default=0.28, ge=0)
    """Upper clip bound 1 + eps_high (clip-higher)."""


@LOSSES.config
class GspoLossConfig(_LossCommon):
    """GSPO: the clipped surrogate on each sample's sequence ratio (arXiv 2507.18071)."""

    type: Literal["gspo"] = "gspo"
    normalization: Normalization = "sequence"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    eps_low: float = Field(default=3e-4, ge=0, lt=1)
    """Lower clip bound 1 - eps_low on the sequence ratio."""
    eps_high: float = Field(default=4e-4, ge=0)
    """Upper clip bound 1 + eps_high on the sequence ratio."""


@LOSSES.config
class GspoTokenLossConfig(GspoLossConfig):
    """GSPO-token: the value of GSPO with a per-token gradient path (for token-level advantages)."""

    type: Literal["gspo_token"] = "gspo_token"  # type: ignore[assignment]


@LOSSES.config
class FipoLossConfig(DapoLossConfig):
    """FIPO: the DAPO loss weighted by a clipped, discounted future-KL influence per token."""

    type: Literal["fipo"] = "fipo"  # type: ignore[assignment]
    gamma: float = Field(default=0.99, ge=0, le=1)
    """Discount of the future log-ratio sum."""
    eps_f: float = Field(default=0.2, ge=0, lt=1)
    """Influence weight is clipped to [1 - eps_f, 1 + eps_f]."""
    detach_influence: bool = True
    """Treat the influence weight as a constant (no gradient through it)."""


@LOSSES.config
class IsReshapeLossConfig(_LossCommon):
    """Rényi importance-sampling reshape: the weight w^gamma with an adaptive, per-token exponent gamma."""

    type: Literal["is_reshape"] = "is_reshape"
    needs_log_ratio_moments: ClassVar[bool] = True
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""
    rho_min: float = Field(default=0.3, gt=0, lt=1)
    """Target minimum effective sample ratio: sets gamma_base from the step's log-ratio variance
    (docs/losses.md#is_reshape--rényi-importance-sampling-reshape)."""
    tau: float = Field(default=1.0, gt=0)
    """Temperature of the advantage gate P."""
    T: float = Field(default=5.0, gt=0)
    """Sharpness of the target exponent gamma_target."""
    gamma_min: float = Field(default=0.05, ge=0, le=1)
    """Lower bound on the exponent gamma."""
    clip_weight: bool = False
    """Cap the reshaped weight at clip_threshold."""
    clip_threshold: float = Field(default=10.0, gt=0)
    """Cap on the reshaped weight when clip_weight is true."""


@LOSSES.config
class CustomLossConfig(_LossCommon):
    """A user-supplied loss function, imported by path (see docs/bring-your-own-algorithm.md)."""

    type: Literal["custom"] = "custom"
    import_path: str
    """'pkg.module:function' or 'pkg.module.function'; called as `contract` says."""
    contract: Literal["inputs", "view"] = "inputs"
    """inputs: fn(inputs: LossInputs, **kwargs) -> per-token losses, a sum, or (loss, metrics); view: the built-in
    variants' contract, fn(view: TokenView, **kwargs) -> PolicyTerm (masked, NaN-safe tensors in; loss, gate and
    clip flags out; docs/losses.md, "Writing a variant")."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the function."""
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step (docs/losses.md#normalization)."""

    @field_validator("import_path")
    @classmethod
    def _importable(cls, value: str) -> str:
        import_callable(value)
        return value


LossConfig = LOSSES.union()
"""The `[loss]` section: one of the registered variants, selected by `type`."""

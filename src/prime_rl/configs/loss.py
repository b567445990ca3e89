"""`[loss]`: a discriminated union on `type`, one pydantic model per loss variant.

Every variant is registered in `LOSSES` (`@LOSSES.config`); its function, in
`prime_rl.trainer.rl.losses`, registers with `@LOSSES.implements(ItsConfig)`, and `LossConfig`
is the union of the registered classes. See docs/losses.md for the formulas, defaults and papers.
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

LOSSES: Registry[Any] = Registry("loss", implemented_in="prime_rl.trainer.rl.losses")

Normalization = Literal["token", "sequence", "token_local", "constant"]
KLType = Literal["k1", "k2", "k3", "low_var_kl"]


class _LossCommon(BaseConfig):
    """Keys every loss type accepts."""

    kl_coef: float = Field(default=0.0, ge=0)
    """Weight of the KL-to-reference penalty (needs `ref_logprobs` in the batch when > 0)."""
    kl_type: KLType = "k3"
    """KL estimator on `d = lp - ref`: k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1 (exp(-d) continued linearly below d =
    -20, so it cannot overflow), low_var_kl = k3 with d clamped to [-20, 20], then clamped to [-10, 10]."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus (subtracts entropy_coef * entropy per token; needs entropies from the trainer)."""

    needs_log_ratio_moments: ClassVar[bool] = False
    """True for a variant whose loss depends on a statistic of the whole step (`LossScale.log_ratio_moments`)."""


def _check_low_high(config: BaseConfig, *pairs: tuple[str, str]) -> None:
    for low, high in pairs:
        lo, hi = getattr(config, low), getattr(config, high)
        if not lo < hi:
            raise ValueError(f"{low} ({lo}) must be smaller than {high} ({hi})")


class _AdvantageShaping(BaseConfig):
    """Â = adv_tau * A + teacher_tau * sg(teacher - lp) - kl_tau * log r."""

    adv_tau: float = 1.0
    """Weight of the advantage A in the shaped advantage."""
    teacher_tau: float = Field(default=0.0, ge=0)
    """Weight of the teacher term sg(teacher_logprob - lp) (needs `teacher_logprobs` when > 0)."""
    kl_tau: float = Field(default=0.0, ge=0)
    """Weight of the inference-mismatch penalty -log r in the shaped advantage."""


@LOSSES.config
class DefaultLossConfig(_LossCommon, _AdvantageShaping):
    """AIPO: masked importance sampling (prime-rl's default)."""

    type: Literal["default"] = "default"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""
    ratio_type: Literal["token", "sequence"] = "token"
    """Importance weight: per-token r, or the sample's min(exp(min(sum log r, 10)), sequence_clip_high)."""
    token_mask_low: float = Field(default=0.125, ge=0)
    """Mask a token whose ratio r is below this."""
    token_mask_high: float = Field(default=8.0, gt=0)
    """Mask a token whose ratio r is above this."""
    geo_mask_low: float = Field(default=0.1, ge=0)
    """Mask a whole sample whose geometric-mean ratio exp(mean log r) is below this."""
    geo_mask_high: float = Field(default=10.0, gt=0)
    """Mask a whole sample whose geometric-mean ratio exp(mean log r) is above this."""
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
    """How per-token losses are reduced over the step."""
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
    """How per-token losses are reduced over the step."""
    eps_high: float = Field(default=5.0, gt=0)
    """The weight is clipped at 1 + eps_high."""
    eps_low: float | None = Field(default=None, ge=0)
    """The weight is clipped at 1 - eps_low; None = no lower bound."""


@LOSSES.config
class VanillaLossConfig(_LossCommon):
    """Plain importance-sampled policy gradient -r * A, no clipping."""

    type: Literal["vanilla"] = "vanilla"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""


class PPOClipConfig(_LossCommon):
    """The clipped PPO surrogate -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)."""

    eps_low: float = Field(default=0.2, ge=0, lt=1)
    """Lower clip bound 1 - eps_low."""
    eps_high: float = Field(default=0.2, ge=0)
    """Upper clip bound 1 + eps_high."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip: for A < 0 the loss is capped at -c * A (None = off; must be > 1)."""
    opsm_delta: float | None = Field(default=None, ge=0)
    """Off-policy sequence masking: drop token t when A_t < 0 and its sample's mean(lq - lp) > delta (None = off)."""


@LOSSES.config
class GrpoLossConfig(PPOClipConfig):
    """GRPO: clipped surrogate, each sample's token mean, mean over samples (arXiv 2402.03300)."""

    type: Literal["grpo"] = "grpo"
    normalization: Normalization = "sequence"
    """How per-token losses are reduced over the step."""


@LOSSES.config
class BnpoLossConfig(PPOClipConfig):
    """`bnpo`: clipped surrogate, sum over the step's trained tokens / their count (TRL's `loss_type = "bnpo"`)."""

    type: Literal["bnpo"] = "bnpo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""


@LOSSES.config
class DrGrpoLossConfig(PPOClipConfig):
    """Dr. GRPO: clipped surrogate, sum divided by a constant N * max_tokens, N = samples with a trained token (arXiv
    2503.20783)."""

    type: Literal["dr_grpo"] = "dr_grpo"
    normalization: Normalization = "constant"
    """How per-token losses are reduced over the step."""


@LOSSES.config
class DapoLossConfig(PPOClipConfig):
    """DAPO: clip-higher surrogate, token mean over the step (arXiv 2503.14476)."""

    type: Literal["dapo"] = "dapo"
    normalization: Normalization = "token"
    """How per-token losses are reduced over the step."""
    eps_high: float = Field(default=0.28, ge=0)
    """Upper clip bound 1 + eps_high (clip-higher)."""


@LOSSES.config
class GspoLossConfig(_LossCommon):
    """GSPO: clipped surrogate on the sequence ratio exp(mean log r) (arXiv 2507.18071)."""

    type: Literal["gspo"] = "gspo"
    normalization: Normalization = "sequence"
    """How per-token losses are reduced over the step."""
    eps_low: float = Field(default=3e-4, ge=0, lt=1)
    """Lower clip bound 1 - eps_low on the sequence ratio."""
    eps_high: float = Field(default=4e-4, ge=0)
    """Upper clip bound 1 + eps_high on the sequence ratio."""


@LOSSES.config
class GspoTokenLossConfig(GspoLossConfig):
    """GSPO-token: per-token ratio sg(s_i) * exp(lp - sg(lp)), same value as GSPO, per-token gradient path."""

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
    """How per-token losses are reduced over the step."""
    rho_min: float = Field(default=0.3, gt=0, lt=1)
    """Target minimum effective sample ratio; gamma_base = min(1, sqrt(-log(rho_min) / var(log w)))."""
    tau: float = Field(default=1.0, gt=0)
    """Temperature of the advantage gate P = sigmoid(A * log w / tau)."""
    T: float = Field(default=5.0, gt=0)
    """Sharpness of the target exponent gamma_target = sigmoid(-T * log w)."""
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
    """How per-token losses are reduced over the step."""

    @field_validator("import_path")
    @classmethod
    def _importable(cls, value: str) -> str:
        import_callable(value)
        return value


LossConfig = LOSSES.union()
"""The `[loss]` section: one of the registered variants, selected by `type`."""

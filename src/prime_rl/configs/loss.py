"""`[loss]`: a discriminated union on `type`, one pydantic model per loss variant.

Every variant is registered in `LOSSES` (`@LOSSES.config`); its function, in
`prime_rl.trainer.rl.losses`, registers with `@LOSSES.implements(ItsConfig)`, and `LossConfig`
is the union of the registered classes. The formulas, defaults and papers: docs/losses.md (their one home).
Every variant has a `normalization` (with its own default), an optional KL-to-reference term
(`kl_coef`, `kl_type`) and an entropy bonus (`entropy_coef`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar, Literal

from pydantic import Field, field_serializer, field_validator, model_validator

from prime_rl.configs.base import NONE, BaseConfig
from prime_rl.configs.extensions import Registry
from prime_rl.utils.imports import import_callable

LOSSES: Registry[Any] = Registry("loss", implemented_in="prime_rl.trainer.rl.losses", default="default")

Normalization = Literal["token", "sequence", "token_local", "constant"]
KLType = Literal["k1", "k2", "k3", "low_var_kl"]


RULES_K1 = ("token_k1", "seq_sum_k1", "seq_mean_k1")
RejectionStatistic = Literal[
    "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3", "veto",
]


class RejectionRule(BaseConfig):
    """One rejection rule of `[loss.correction]` on the behaviour ratio rho_t = exp(x_t - lq_t)
    (docs/losses.md#rollout-correction). k1 rules bound a ratio: rho_t (`token_k1`), the sample's product
    (`seq_sum_k1`) or geometric mean (`seq_mean_k1`, Geo-RS); k2 / k3 rules bound the statistic
    k2 = (log rho)^2 / 2 or k3 = rho - 1 - log rho per token, or its sum, mean or max over the sample; `veto` rejects a
    sample with any token ratio below `low` (or above `high`). A rejected token trains nothing but still counts in
    the normalization's denominators."""

    rule: RejectionStatistic
    """The statistic and its level (token_*: a token; seq_*: the whole sample; veto: the whole sample)."""
    low: float | None = Field(default=None, gt=0)
    """k1 rules and veto: the lowest ratio kept (None: no lower bound). Not for k2 / k3 rules."""
    high: float | None = Field(default=None, gt=0)
    """k1 rules and veto: the highest ratio kept; k2 / k3 rules: the largest statistic kept (required)."""

    @model_validator(mode="after")
    def _bounds(self) -> RejectionRule:
        bounded_ratio = self.rule in RULES_K1 or self.rule == "veto"
        if not bounded_ratio and self.low is not None:
            raise ValueError(f"rejection rule {self.rule} bounds a divergence from above only: set high, not low")
        if not bounded_ratio and self.high is None:
            raise ValueError(f"rejection rule {self.rule} needs high (the largest statistic kept)")
        if bounded_ratio and self.low is None and self.high is None:
            raise ValueError(f"rejection rule {self.rule} needs low, high or both")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise ValueError(f"rejection rule {self.rule}: low ({self.low}) must be smaller than high ({self.high})")
        return self


OldLogprobs = Literal["sampler", "trainer", "current"]
ISWeight = Literal["none", "token", "sequence"]


def _verl_k1(low: float, high: float) -> dict[str, float]:
    """verl's k1 threshold "l_u" bounds k1 = -log rho, i.e. the ratio to [1/u, 1/l]: as ratio bounds."""
    return {"low": 1 / high, "high": 1 / low}


_GEO = {"rule": "seq_mean_k1", **_verl_k1(0.999, 1.001)}
_K3 = {"rule": "seq_mean_k3", "high": 0.01}
_TOKEN_TIS = {"weight": "token", "weight_cap": 2.0}
_SEQ_TIS = {"weight": "sequence", "weight_cap": 2.0}
_ICEPOP = {"weight": "token", "weight_bounds": (0.5, 5.0)}
CORRECTION_PRESETS: dict[str, dict[str, Any]] = {
    # verl's RolloutCorrectionConfig presets (verl/trainer/config/algorithm.py), by name.
    "decoupled_token_is": {"old_logprobs": "trainer", **_TOKEN_TIS},
    "decoupled_seq_is": {"old_logprobs": "trainer", **_SEQ_TIS},
    "decoupled_token_icepop": {"old_logprobs": "trainer", **_ICEPOP},
    "decoupled_seq_is_rs": {"old_logprobs": "trainer", **_SEQ_TIS,
                            "reject": [{"rule": "seq_sum_k1", **_verl_k1(0.5, 2.0)}]},
    "decoupled_geo_rs": {"old_logprobs": "trainer", "reject": [_GEO]},
    "decoupled_geo_rs_seq_tis": {"old_logprobs": "trainer", **_SEQ_TIS, "reject": [_GEO]},
    "decoupled_geo_rs_token_tis": {"old_logprobs": "trainer", **_TOKEN_TIS, "reject": [_GEO]},
    "decoupled_k3_rs": {"old_logprobs": "trainer", "reject": [_K3]},
    "decoupled_k3_rs_seq_tis": {"old_logprobs": "trainer", **_SEQ_TIS, "reject": [_K3]},
    "decoupled_k3_rs_token_tis": {"old_logprobs": "trainer", **_TOKEN_TIS, "reject": [_K3]},
    "bypass_ppo_clip": {"old_logprobs": "sampler"},
    "bypass_ppo_clip_geo_rs": {"old_logprobs": "sampler", "reject": [_GEO]},
    "bypass_ppo_clip_k3_rs": {"old_logprobs": "sampler", "reject": [_K3]},
    "bypass_pg_is": {"old_logprobs": "current", **_SEQ_TIS},
    "bypass_pg_token_icepop": {"old_logprobs": "current", **_ICEPOP},
    "bypass_pg_geo_rs": {"old_logprobs": "current", "reject": [_GEO]},
    "bypass_pg_geo_rs_seq_tis": {"old_logprobs": "current", **_SEQ_TIS, "reject": [_GEO]},
    "bypass_pg_geo_rs_token_tis": {"old_logprobs": "current", **_TOKEN_TIS, "reject": [_GEO]},
    # The other peers' named settings (docs/losses.md#presets: each one's convention).
    "openrlhf_tis": {"old_logprobs": "trainer", "weight": "token", "weight_floor": 0.5, "weight_cap": 5.0},
    "openrlhf_icepop": {"old_logprobs": "trainer", **_ICEPOP},
    "openrlhf_seq_mask_tis": {"old_logprobs": "trainer", "weight": "token", "weight_cap": math.inf,
                              "reject": [{"rule": "seq_mean_k1", "low": 0.5, "high": 5.0}]},
    "slime_tis": {"old_logprobs": "trainer", "weight": "token", "weight_floor": 0.0, "weight_cap": 2.0},
    "slime_icepop": {"old_logprobs": "trainer", "weight": "token", "weight_bounds": (0.0, 2.0)},
    "areal_decoupled": {"old_logprobs": "trainer", "weight": "token", "weight_cap": math.inf,
                        "reject": [{"rule": "token_k1", "high": 5.0}]},
}
"""The named settings of `[loss.correction] preset`: verl's by their own names, the others prefixed by the peer."""


class CorrectionConfig(BaseConfig):
    """`[loss.correction]`: rollout correction, a stage every loss type accepts
    (docs/losses.md#rollout-correction). The surrogate's ratio is taken against `old_logprobs` (x); the behaviour
    ratio rho_t = exp(x_t - lq_t) to the sampler drives an importance weight and rejection rules. The default
    (sampler, no weight, no rule) is no correction: the loss as its type defines it."""

    preset: Literal[tuple(CORRECTION_PRESETS)] | None = None  # type: ignore[valid-type]
    """A peer's named setting (docs/losses.md#presets); keys set next to it override the preset's."""
    old_logprobs: OldLogprobs = "sampler"
    """pi_old of the surrogate: sampler (lq: two policies, verl's bypass mode), trainer (a no-grad forward of the
    batch before its first update: decoupled PPO's three policies) or current (sg(lp) of each pass: the weight
    carries the whole correction, as AReaL's reuse_train_logp and slime without an old forward)."""
    weight: ISWeight = "none"
    """The behaviour importance weight multiplying every token's loss: per token, or the sample's product."""
    weight_cap: float = Field(default=2.0, gt=0, allow_inf_nan=True)
    """C of truncated IS (TIS): w = min(rho, C); inf (or "none"): not truncated."""
    weight_floor: float = Field(default=0.0, ge=0)
    """The lower clamp of a two-sided TIS (OpenRLHF): w = clamp(rho, floor, C)."""
    weight_bounds: tuple[float, float] | None = None
    """IcePop [l, u]: w = rho where l <= rho <= u, else 0 (replaces the cap and floor)."""
    weight_batch_normalize: bool = False
    """Divide the weights by their mean over the step (tokens, or samples for `sequence`; all ranks)."""
    reject: list[RejectionRule] = Field(default_factory=list)
    """Rejection rules, `[[loss.correction.reject]]` tables of `rule` (token_k1|k2|k3, seq_sum_k1|k2|k3,
    seq_mean_k1|k2|k3, seq_max_k2|k3, veto), `low` and `high` (docs/losses.md#rollout-correction); all applied (a token
    survives only if every rule keeps it), each on the tokens as they came (not on what an earlier rule left)."""

    @field_validator("weight_cap", mode="before")
    @classmethod
    def _no_cap(cls, value: Any) -> Any:
        if value == NONE:
            return math.inf
        if isinstance(value, float) and math.isnan(value):
            raise ValueError("weight_cap must be a number > 0 or inf, not nan")
        return value

    @field_serializer("weight_cap")
    def _cap_text(self, value: float) -> float | str:
        """No cap written as "none": TOML has no inf in JSON dumps, and `rl` hands configs on as TOML."""
        return NONE if math.isinf(value) else value

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") is not None:
            name = data["preset"]
            if name not in CORRECTION_PRESETS:
                raise ValueError(f"unknown correction preset {name!r}; known: {', '.join(CORRECTION_PRESETS)}")
            return {**CORRECTION_PRESETS[name], **data}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> CorrectionConfig:
        if self.weight_bounds is not None:
            low, high = self.weight_bounds
            if not 0 <= low < high:
                raise ValueError(f"weight_bounds [l, u] needs 0 <= l < u, got [{low}, {high}]")
        if self.weight_floor >= self.weight_cap:
            raise ValueError(f"weight_floor ({self.weight_floor}) must be smaller than weight_cap ({self.weight_cap})")
        unused: list[str] = []
        if self.weight == "none":
            unused = ["weight_cap", "weight_floor", "weight_bounds", "weight_batch_normalize"]
        elif self.weight_bounds is not None:
            unused = ["weight_cap", "weight_floor"]
        unused = [k for k in unused if getattr(self, k) != type(self).model_fields[k].default]
        if unused:
            reason = "weight = 'none'" if self.weight == "none" else "weight_bounds (IcePop) replaces the cap and floor"
            raise ValueError(f"{', '.join(unused)} would do nothing: {reason}")
        names = [rule.rule for rule in self.reject]
        if len(set(names)) < len(names):
            raise ValueError(f"a rejection rule is listed twice ({', '.join(names)}): give each statistic one rule")
        if self.weight != "none" and self.old_logprobs == "sampler":
            raise ValueError("an importance weight with old_logprobs = 'sampler' would weight the ratio to the "
                             "sampler by itself; use old_logprobs = 'trainer' (decoupled) or 'current'")
        return self

    @property
    def active(self) -> bool:
        """Whether the stage runs (and logs its `correction/` metrics): a preset is named or a key differs from the
        default."""
        return self.preset is not None or self.old_logprobs != "sampler" or self.weight != "none" or bool(self.reject)


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
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    """Rollout correction (`[loss.correction]`): the old policy of the surrogate, a behaviour importance weight,
    rejection rules (docs/losses.md#rollout-correction)."""

    @model_validator(mode="after")
    def _correction_fits_type(self) -> Any:
        preset, kind = self.correction.preset, getattr(self, "type", None)
        if preset is not None and preset.startswith("bypass_pg") and kind != "vanilla":
            raise ValueError(f"correction preset {preset} is verl's REINFORCE with the weight: use type = 'vanilla'"
                             f" (not {kind!r})")
        ppo_clip_types = [name for name, cls in LOSSES.configs.items() if issubclass(cls, PPOClipConfig)]
        if preset is not None and preset.startswith("bypass_ppo_clip") and kind not in ppo_clip_types:
            raise ValueError(f"correction preset {preset} is verl's PPO clip on the ratio to the sampler: use type = "
                             f"one of {', '.join(ppo_clip_types)} (not {kind!r})")
        return self


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

"""The clipped PPO surrogate family (`grpo`, `bnpo`, `dr_grpo`, `dapo`), its FIPO weighting, and `vanilla`."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from prime_rl.configs.loss import (
    LOSSES,
    BnpoLossConfig,
    DapoLossConfig,
    DrGrpoLossConfig,
    FipoLossConfig,
    GrpoLossConfig,
    PPOClipConfig,
    VanillaLossConfig,
)
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView
from prime_rl.trainer.rl.losses.loss_metrics import token_metric
from prime_rl.trainer.rl.losses.segments import (
    broadcast_to_tokens,
    reverse_discounted_sum,
    segment_masked_mean,
)


@LOSSES.implements(VanillaLossConfig)
def vanilla_loss(cfg: VanillaLossConfig, p: TokenView) -> PolicyTerm:
    """Plain importance-sampled policy gradient, no clipping
    (docs/losses.md#vanilla--importance-sampled-policy-gradient)."""
    none = torch.zeros_like(p.mask)
    return PolicyTerm(-p.r * p.adv, p.mask.to(p.r.dtype), none, none)


def opsm_keep(cfg: PPOClipConfig, p: TokenView) -> Tensor:
    """[T] bool, False on the tokens OPSM drops (DeepSeek-V3.2, slime): its advantage condition is per
    token (token-level advantages may differ in sign within a sample), its drift condition per sample
    (docs/losses.md#grpo-bnpo-dr_grpo-dapo--the-clipped-ppo-surrogate)."""
    if cfg.opsm_delta is None:
        return torch.ones_like(p.mask)
    drift = segment_masked_mean(-p.log_r.detach(), p.mask, p.sample_lens)
    return ~((p.adv < 0) & broadcast_to_tokens(drift > cfg.opsm_delta, p.sample_lens))


@LOSSES.implements(GrpoLossConfig, BnpoLossConfig, DrGrpoLossConfig, DapoLossConfig)
def ppo_clip_loss(cfg: PPOClipConfig, p: TokenView) -> PolicyTerm:
    """GRPO / BNPO / Dr. GRPO / DAPO, which differ in eps and normalization only: the clipped PPO surrogate
    with the optional dual clip and OPSM (`_opsm_keep`). A token's gate is 1, or 0 where a clip, the dual clip or
    OPSM removes its gradient (docs/losses.md#grpo-bnpo-dr_grpo-dapo--the-clipped-ppo-surrogate)."""
    r = p.r
    adv = p.adv
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    surrogate = torch.minimum(r * adv, r.clamp(lo, hi) * adv)
    rd = r.detach()
    clip_low = p.mask & (adv < 0) & (rd < lo)
    clip_high = p.mask & (adv > 0) & (rd > hi)
    if cfg.dual_clip_c is not None:
        # Dual clip: floor the surrogate of a negative-advantage token, which caps its loss.
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, cfg.dual_clip_c * adv), surrogate)
        clip_high = clip_high | (p.mask & (adv < 0) & (rd > cfg.dual_clip_c))
    keep = opsm_keep(cfg, p)
    loss = torch.where(keep & p.mask, -surrogate, torch.zeros_like(surrogate))
    gate = (p.mask & keep & ~clip_low & ~clip_high).to(r.dtype)
    extra = {}
    if cfg.opsm_delta is not None:
        extra["loss/opsm_masked_frac"] = token_metric((~keep).float(), p.mask)
    # Tokens OPSM drops count as low-clipped: a negative token of a sample pushed below the sampler.
    clip_low = clip_low | (p.mask & ~keep)
    clip_high = clip_high & ~clip_low
    return PolicyTerm(loss, gate, clip_low, clip_high, extra)


@LOSSES.implements(FipoLossConfig)
def fipo_loss(cfg: FipoLossConfig, p: TokenView) -> PolicyTerm:
    """FIPO: the DAPO loss (`ppo_clip_loss`) weighted per token by the future influence f_t, a clipped,
    discounted sum of the sample's later log ratios over its trained tokens only (`reverse_discounted_sum`; the clip
    acts on the exponent, so nothing overflows), detached unless detach_influence = false
    (docs/losses.md#fipo--future-kl-influence-policy-optimization)."""
    future = reverse_discounted_sum(p.log_r, p.mask, p.sample_lens, cfg.gamma)
    influence = torch.exp(future.clamp(math.log(1 - cfg.eps_f), math.log(1 + cfg.eps_f)))
    if cfg.detach_influence:
        influence = influence.detach()
    base = ppo_clip_loss(cfg, p)
    fd = influence.detach()
    extra = dict(base.extra)
    extra["loss/future_influence"] = token_metric(fd, p.mask)
    return PolicyTerm(
        p.off_mask_zero(influence * base.loss), p.off_mask_zero(fd * base.gate), base.clip_low, base.clip_high, extra
    )

"""`is_reshape`: the Rényi importance-sampling reshape, which reads the step's log-ratio moments."""

from __future__ import annotations

import math

import torch

from prime_rl.configs.loss import LOSSES, IsReshapeLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView, log_ratio_moments_of, safe_div
from prime_rl.trainer.rl.losses.loss_metrics import scalar_metric, token_metric


def _log_ratio_variance(p: TokenView) -> float:
    """sigma2 of is_reshape, the unbiased variance of log r over the step's trained tokens, from the
    step's moments (`LossScale.log_ratio_moments`; this call's own when absent); 0 when n < 2 (float64 sums, a
    Python float). The formula: docs/losses.md#is_reshape--rényi-importance-sampling-reshape."""
    step = p.log_ratio_moments
    s1, s2, n = step if step is not None else log_ratio_moments_of(p).tolist()
    sigma2 = (s2 - s1 * s1 / n) / (n - 1) if n > 1 else 0.0
    return max(sigma2, 0.0)  # max: rounding can make a zero variance slightly negative


@LOSSES.implements(IsReshapeLossConfig)
def is_reshape_loss(cfg: IsReshapeLossConfig, p: TokenView) -> PolicyTerm:
    """Rényi IS reshape: the importance weight raised to a detached per-token exponent gamma, set from the
    variance of log r over the STEP's trained tokens (all micro-batches and ranks, `_log_ratio_variance`, so the loss
    does not depend on the split) and from the token's advantage and ratio; capped at clip_threshold with
    clip_weight. The reported gate is 0 where the cap is active
    (docs/losses.md#is_reshape--rényi-importance-sampling-reshape)."""
    log_w = p.log_r
    lw = log_w.detach()
    sigma2 = _log_ratio_variance(p)
    gamma_base = min(1.0, math.sqrt(-math.log(cfg.rho_min) / sigma2)) if sigma2 > 0 else 1.0
    gamma_target = torch.sigmoid(-cfg.T * lw)
    gate_p = torch.sigmoid(p.adv * lw / cfg.tau)
    gamma = torch.clamp(gamma_base + (gamma_target - gamma_base) * gate_p, min=cfg.gamma_min).detach()
    w_g = torch.exp(gamma * log_w)
    wd = w_g.detach()
    clip_high = torch.zeros_like(p.mask)
    if cfg.clip_weight:
        clip_high = p.mask & (wd > cfg.clip_threshold)
        w_g = w_g.clamp(max=cfg.clip_threshold)
    loss = p.off_mask_zero(-w_g * p.adv)
    gate = torch.where(p.mask & ~clip_high, safe_div(gamma * wd, p.r.detach()), torch.zeros_like(wd))
    extra = {
        "loss/gamma_base": scalar_metric(gamma_base),
        "loss/sigma_sq": scalar_metric(sigma2),
        "loss/gamma": token_metric(gamma, p.mask),
        "loss/is_ratio_used": token_metric(w_g.detach(), p.mask),
    }
    return PolicyTerm(loss, gate, torch.zeros_like(p.mask), clip_high, extra)

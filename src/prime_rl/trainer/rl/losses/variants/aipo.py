"""`default` (AIPO, masked importance sampling) and `sapo`, which share the shaped advantage."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prime_rl.configs.loss import LOSSES, DefaultLossConfig, SapoLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView, safe_div
from prime_rl.trainer.rl.losses.loss_metrics import token_metric
from prime_rl.trainer.rl.losses.segments import (
    broadcast_to_tokens,
    segment_any,
    segment_masked_mean,
    segment_sum,
)
from prime_rl.utils.errors import ConfigError


def shaped_advantage(cfg: Any, p: TokenView) -> Tensor:
    """The shaped advantage Â of `default` and `sapo`, detached, 0 off the mask
    (docs/losses.md#default--masked-importance-sampling-aipo-prime-rls-default)."""
    adv = cfg.adv_tau * p.adv
    if cfg.teacher_tau > 0:
        if p.inputs.teacher_logprobs is None:
            raise ConfigError("loss.teacher_tau > 0 but the batch has no teacher_logprobs")
        teacher = p.off_mask_zero(p.inputs.teacher_logprobs.to(p.lp.dtype))
        adv = adv + cfg.teacher_tau * (teacher - p.lp).detach()
    if cfg.kl_tau > 0:
        adv = adv - cfg.kl_tau * p.log_r.detach()
    return p.off_mask_zero(adv.detach())


@LOSSES.implements(DefaultLossConfig)
def default_loss(cfg: DefaultLossConfig, p: TokenView) -> PolicyTerm:
    """AIPO / masked importance sampling: the REINFORCE gradient of the kept tokens with a stop-gradient
    importance weight (the token's ratio, or the sample's capped sequence ratio); a token or a whole sample outside
    its bounds is masked, not capped (docs/losses.md#default--masked-importance-sampling-aipo-prime-rls-default)."""
    r, lens = p.r.detach(), p.sample_lens
    log_r = p.log_r.detach()
    tok_low = p.mask & (r < cfg.token_mask_low)
    tok_high = p.mask & (r > cfg.token_mask_high)
    geo = torch.exp(segment_masked_mean(log_r, p.mask, lens))
    seq_low = (geo < cfg.geo_mask_low) | segment_any(p.mask & (r < cfg.sequence_mask_low), lens)
    seq_high = (geo > cfg.geo_mask_high) | segment_any(p.mask & (r > cfg.sequence_mask_high), lens)
    seq_low_t = broadcast_to_tokens(seq_low, lens) & p.mask
    seq_high_t = broadcast_to_tokens(seq_high, lens) & p.mask
    # Direction of a removed gradient: the token's own bound first, then the sample's.
    clip_low = tok_low | (seq_low_t & ~tok_high)
    clip_high = (tok_high | seq_high_t) & ~clip_low
    keep = p.mask & ~clip_low & ~clip_high
    if cfg.ratio_type == "sequence":
        log_seq = segment_sum(log_r, lens).clamp(max=10.0)
        weight = broadcast_to_tokens(torch.exp(log_seq).clamp(max=cfg.sequence_clip_high), lens)
    else:
        weight = r
    coef = torch.where(keep, weight * shaped_advantage(cfg, p), torch.zeros_like(r))
    loss = -coef.detach() * p.lp
    gate = torch.where(keep, safe_div(weight, r), torch.zeros_like(r))
    extra = {"loss/sequence_masked_frac": token_metric((seq_low_t | seq_high_t).float(), p.mask)}
    return PolicyTerm(loss, gate, clip_low, clip_high, extra)


@LOSSES.implements(SapoLossConfig)
def sapo_loss(cfg: SapoLossConfig, p: TokenView) -> PolicyTerm:
    """SAPO: a sigmoid gate of r instead of a hard clip, differentiable through r itself, its temperature
    tau_pos or tau_neg by the sign of Â; the reported gate is its gradient weight
    (docs/losses.md#sapo--soft-adaptive-policy-optimization-arxiv-251120347)."""
    adv = shaped_advantage(cfg, p)
    tau = torch.where(adv > 0, torch.full_like(adv, cfg.tau_pos), torch.full_like(adv, cfg.tau_neg))
    gate_p = torch.sigmoid(tau * (p.r - 1))
    loss = p.off_mask_zero(-(4 / tau) * gate_p * adv)
    pd = gate_p.detach()
    gate = p.off_mask_zero(4 * pd * (1 - pd))
    none = torch.zeros_like(p.mask)
    return PolicyTerm(loss, gate, none, none)

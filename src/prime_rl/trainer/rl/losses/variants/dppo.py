"""`dppo`: upstream prime-rl's default objective."""

from __future__ import annotations

import torch

from prime_rl.configs.loss import LOSSES, DppoLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView, safe_div


@LOSSES.implements(DppoLossConfig)
def dppo_loss(cfg: DppoLossConfig, p: TokenView) -> PolicyTerm:
    """Upstream prime-rl's default: the importance-sampled policy gradient on the tokens inside DPPO's trust region
    (judged by the advantage's sign on the probability difference), plus kl_tau * (log r)^2 on every token
    (docs/losses.md#dppo--upstream-prime-rls-default)."""
    lq = p.off_mask_zero(p.old)  # the old policy: the sampler unless [loss.correction] names another
    diff = (torch.exp(p.lp) - torch.exp(lq)).detach()
    rose, fell = diff > cfg.mask_high, diff < -cfg.mask_low
    up = p.adv > 0
    keep = p.mask & ~torch.where(up, rose, fell)
    loss = -torch.where(keep, cfg.adv_tau * p.adv * p.r, torch.zeros_like(p.r)) + cfg.kl_tau * p.log_r.square()
    clip_high, clip_low = p.mask & up & rose, p.mask & (p.adv < 0) & fell
    # The gate: -d l_t / d lp_t over r_t A_t, the KL term's pull included (0 where A = 0).
    r, log_r = p.r.detach(), p.log_r.detach()
    pull = torch.where(keep, cfg.adv_tau * p.adv * r, torch.zeros_like(r)) - 2 * cfg.kl_tau * log_r
    gate = p.off_mask_zero(safe_div(pull, r * p.adv.abs()) * p.adv.sign())
    return PolicyTerm(p.off_mask_zero(loss), gate, clip_low, clip_high)

"""`cispo`: the clipped, stop-gradient importance weight on every token."""

from __future__ import annotations

import torch

from prime_rl.configs.loss import LOSSES, CispoLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView, safe_div


@LOSSES.implements(CispoLossConfig)
def cispo_loss(cfg: CispoLossConfig, p: TokenView) -> PolicyTerm:
    """CISPO: every token's policy gradient with a clipped, stop-gradient importance weight (no lower bound
    when eps_low is None), so every token keeps a gradient
    (docs/losses.md#cispo--clipped-is-weight-policy-optimization-minimax-m1-arxiv-250613585)."""
    r = p.r.detach()
    low = None if cfg.eps_low is None else 1 - cfg.eps_low
    clipped = r.clamp(min=low, max=1 + cfg.eps_high)
    loss = -(clipped * p.adv).detach() * p.lp
    clip_low = p.mask & (r < low) if low is not None else torch.zeros_like(p.mask)
    clip_high = p.mask & (r > 1 + cfg.eps_high)
    gate = p.off_mask_zero(safe_div(clipped, r))
    return PolicyTerm(loss, gate, clip_low, clip_high, through_ratio=False)

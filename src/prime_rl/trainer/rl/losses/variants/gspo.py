"""`gspo` and `gspo_token`: the clipped surrogate on each sample's sequence ratio."""

from __future__ import annotations

import torch

from prime_rl.configs.loss import LOSSES, GspoLossConfig, GspoTokenLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView, safe_div
from prime_rl.trainer.rl.losses.loss_metrics import token_metric
from prime_rl.trainer.rl.losses.segments import (
    broadcast_to_tokens,
    segment_masked_mean,
)


@LOSSES.implements(GspoLossConfig, GspoTokenLossConfig)
def gspo_loss(cfg: GspoLossConfig, p: TokenView) -> PolicyTerm:
    """GSPO: the clipped surrogate on each sample's sequence ratio s_i, the gradient flowing through s_i;
    gspo_token: the same value with a per-token gradient path. The reported gate is s_i / r_t unclipped, 0 clipped
    (docs/losses.md#gspo-gspo_token--group-sequence-policy-optimization-arxiv-250718071)."""
    seq_log = segment_masked_mean(p.log_r, p.mask, p.sample_lens)
    s = broadcast_to_tokens(torch.exp(seq_log), p.sample_lens)
    if isinstance(cfg, GspoTokenLossConfig):
        s = s.detach() * torch.exp(p.lp - p.lp.detach())
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    surrogate = torch.minimum(s * p.adv, s.clamp(lo, hi) * p.adv)
    loss = p.off_mask_zero(-surrogate)
    sd = s.detach()
    clip_low = p.mask & (p.adv < 0) & (sd < lo)
    clip_high = p.mask & (p.adv > 0) & (sd > hi)
    gate = torch.where(p.mask & ~clip_low & ~clip_high, safe_div(sd, p.r.detach()), torch.zeros_like(sd))
    return PolicyTerm(loss, gate, clip_low, clip_high, {"loss/sequence_ratio": token_metric(sd, p.mask)},
                 through_ratio=not isinstance(cfg, GspoTokenLossConfig))

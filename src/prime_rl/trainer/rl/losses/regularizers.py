"""The regularizers every variant accepts: the KL penalty to a reference, the entropy bonus, and the teacher KL
metric (docs/losses.md#regularizers-every-type)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from prime_rl.trainer.rl.losses.contract import LOG_RATIO_BOUND, TokenView
from prime_rl.trainer.rl.losses.loss_metrics import token_metric
from prime_rl.utils.errors import ConfigError


def kl_estimate(lp: Tensor, ref: Tensor, kl_type: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta, on d = lp - ref, by `kl_type`: k1,
    k2, k3 (its exp continued linearly below d = -LOG_RATIO_BOUND, so value and gradient stay finite for every finite
    d) or verl's low_var_kl (clamped). The formulas: docs/losses.md#regularizers-every-type."""
    d = lp - ref
    if kl_type == "k1":
        return d
    if kl_type == "k2":
        return 0.5 * d**2
    if kl_type == "k3":
        d_in = d.clamp(min=-LOG_RATIO_BOUND)  # d - d_in: how far below -B (0 inside, no gradient path)
        return torch.exp(-d_in) * (1 - (d - d_in)) + d - 1
    if kl_type == "low_var_kl":
        d = d.clamp(-20, 20)
        return (torch.exp(-d) + d - 1).clamp(-10, 10)
    raise ValueError(f"unknown kl_type {kl_type!r}")


def regularizers(cfg: Any, p: TokenView, metrics: dict[str, Tensor]) -> Tensor:
    """The per-token term of the regularizers, KL penalty and entropy bonus (docs/losses.md#regularizers-every-type);
    records loss/kl_ref, loss/entropy, and loss/teacher_kl when the batch has teacher logprobs."""
    extra = torch.zeros_like(p.lp)
    inputs = p.inputs
    if cfg.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise ConfigError(f"loss.kl_coef = {cfg.kl_coef} > 0 but the batch has no ref_logprobs")
        ref = torch.where(p.mask, inputs.ref_logprobs.to(p.lp.dtype), p.lp.detach())
        kl = p.off_mask_zero(kl_estimate(p.lp, ref, cfg.kl_type))
        metrics["loss/kl_ref"] = token_metric(kl, p.mask)
        extra = extra + cfg.kl_coef * kl
    if inputs.entropies is not None:
        entropy = p.off_mask_zero(inputs.entropies.to(p.lp.dtype))
        metrics["loss/entropy"] = token_metric(entropy, p.mask)
        if cfg.entropy_coef > 0:
            extra = extra - cfg.entropy_coef * entropy
    elif cfg.entropy_coef > 0:
        raise ConfigError(f"loss.entropy_coef = {cfg.entropy_coef} > 0 but the trainer supplied no entropies")
    if inputs.teacher_logprobs is not None:
        # loss/teacher_kl: the k1 estimate of KL(pi_theta || teacher), sign as in docs/losses.md#on-policy-distillation.
        teacher = p.off_mask_zero(inputs.teacher_logprobs.to(p.lp.dtype))
        metrics["loss/teacher_kl"] = token_metric(p.lp - teacher, p.mask)
    return extra

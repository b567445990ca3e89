"""AdamW, the learning-rate schedule, and gradient-norm clipping over (sharded) parameters."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import LambdaLR
from torchtitan.distributed.utils import clip_grad_norm_

from prime_rl.trainer.config import OptimConfig, SchedulerConfig


def build_optimizer(model: nn.Module, config: OptimConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                             weight_decay=config.weight_decay)


def lr_factor(step: int, config: SchedulerConfig, max_steps: int) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based).

    warm-up: (step + 1) / warmup_steps for step < warmup_steps; then with progress
    p = (step - warmup) / max(1, max_steps - 1 - warmup) in [0, 1] and m = min_lr_ratio:
    constant 1, linear 1 - (1 - m) p, cosine m + (1 - m) (1 + cos(pi p)) / 2.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.type == "constant":
        return 1.0
    decay_steps = max(1, max_steps - 1 - config.warmup_steps)
    p = min(1.0, (step - config.warmup_steps) / decay_steps)
    m = config.min_lr_ratio
    if config.type == "linear":
        return 1.0 - (1.0 - m) * p
    return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * p))


def build_scheduler(optimizer: torch.optim.Optimizer, config: SchedulerConfig, max_steps: int) -> LambdaLR:
    """One scheduler step per trainer step (batch)."""
    return LambdaLR(optimizer, lambda step: lr_factor(step, config, max_steps))


def clip_gradients(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Global L2 gradient norm over all ranks (DTensor-aware); clips to `max_norm` when set."""
    params = [p for p in model.parameters() if p.grad is not None]
    return clip_grad_norm_(params, max_norm if max_norm is not None else math.inf, foreach=True)

"""The types computed in the trainer (`reinforce_plus_plus`, `gae`): per-token advantages of one packed row, once
per step, before the update epochs, from the batch's `rewards` (each sample's reward R on its last trained token).

Per sample, over its trained tokens in order (tokens off the loss mask, such as a multi-turn sample's
environment tokens, are skipped: the next trained token is the next state), from the per-token rewards r_t
(`kl.token_rewards`): the GAE recursion `gae`, and its returns G_t, the critic's regression target. The
formulas: docs/losses.md#token-level-advantages.

`gae` uses the critic's V (`trainer/critic.py`); `reinforce_plus_plus` is the same recursion with V = 0
and lam = 1, the discounted return. Whitening (REINFORCE++ always, `gae` with `whiten`; the trainer applies it
to a type whose config is `whitened`) is `whiten_tokens`, over every trained token of the step on every rank.
It is not `group.whiten_samples`, which whitens one advantage per sample and keeps no-signal groups at 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from prime_rl.advantages.group import EPS
from prime_rl.configs.advantage import ADVANTAGES, GaeAdvantageConfig, ReinforcePlusPlusAdvantageConfig


@dataclass(frozen=True)
class TokenRow:
    """What a trainer-computed type's function gets: one packed row of the batch, flat over its T tokens."""

    rewards: Tensor  # [T] float64: r_t, 0 off the mask (module docstring)
    values: Tensor  # [T] float64: the critic's V_t (advantage type gae), else 0; 0 off the mask
    mask: Tensor  # [T] bool: the trained tokens (the batch's loss_mask)
    sample_lens: Tensor  # [S] long: the row's segments, end to end


def gae(rewards: Tensor, values: Tensor, mask: Tensor, sample_lens: Tensor, gamma: float, lam: float) -> Tensor:
    """A [T] float64 of one packed row: the GAE recursion (docs/losses.md#token-level-advantages) within each
    segment (`sample_lens`), over its trained tokens (`mask`) only; 0 off the mask."""
    r, v, m = rewards.double().tolist(), values.double().tolist(), mask.tolist()
    advantages = [0.0] * len(r)
    end = len(r)
    for length in reversed(sample_lens.tolist()):
        start = end - length
        next_value = running = 0.0
        for t in range(end - 1, start - 1, -1):
            if not m[t]:
                continue
            running = r[t] + gamma * next_value - v[t] + gamma * lam * running
            advantages[t] = running
            next_value = v[t]
        end = start
    return torch.tensor(advantages, dtype=torch.float64)


@ADVANTAGES.implements(GaeAdvantageConfig)
def generalized_advantage(row: TokenRow, gamma: float, lam: float) -> Tensor:
    """GAE over the critic's values: `gae` with the row's V."""
    return gae(row.rewards, row.values, row.mask, row.sample_lens, gamma, lam)


@ADVANTAGES.implements(ReinforcePlusPlusAdvantageConfig)
def discounted_return(row: TokenRow, gamma: float) -> Tensor:
    """REINFORCE++'s discounted return: `gae` with V = 0 and lam = 1."""
    return gae(row.rewards, torch.zeros_like(row.rewards), row.mask, row.sample_lens, gamma, 1.0)


def token_moments(values: list[Tensor], masks: list[Tensor]) -> list[float]:
    """[sum, sum of squares, count] of the values on trained tokens (to all-reduce before `whiten_tokens`)."""
    picked = [a[m] for a, m in zip(values, masks, strict=True)]
    return [sum(float(p.sum()) for p in picked), sum(float(p.square().sum()) for p in picked),
            float(sum(p.numel() for p in picked))]


def whiten_tokens(values: list[Tensor], masks: list[Tensor], moments: list[float]) -> list[Tensor]:
    """A whitened with the step's mean and population std on the trained tokens of every row, 0 elsewhere;
    `moments` = [sum, sum of squares, count] of A over the trained tokens of the whole step (all rows, all ranks:
    `token_moments`, all-reduced)."""
    total, squares, count = moments
    if count == 0:
        return values
    mean = total / count
    std = max(squares / count - mean * mean, 0.0) ** 0.5
    return [(a - mean) / (std + EPS) * m for a, m in zip(values, masks, strict=True)]

"""Token-level advantages (`reinforce_plus_plus`, `gae`): computed by the trainer, once per step, before
its update epochs, from the batch's `rewards` (each sample's reward R on its last trained token).

Per sample, over its trained tokens t = 1..n in order (tokens off the loss mask, such as a multi-turn
sample's environment tokens, are skipped: the next trained token is the next state):

    r_t      = R [t = n] - kl_coef * KL_t                 (the KL term only with `kl_in_reward`)
    KL_t     = lq_t - lref_t                               (k1)
             = exp(lref_t - lq_t) - (lref_t - lq_t) - 1    (k3, >= 0; `loss.kl_estimate`, the same
                                                            estimator as the loss's KL regularizer,
                                                            finite for every finite input)
    delta_t  = r_t + gamma V_{t+1} - V_t                   (V_{n+1} = 0)
    A_t      = delta_t + gamma lam A_{t+1}                 (A_{n+1} = 0)
    G_t      = A_t + V_t                                   (the critic's regression target)

lq is the sampler's logprob (`inference_logprobs`), lref the frozen reference model's (model.name).
`gae` uses the critic's V (`trainer/critic.py`); `reinforce_plus_plus` is the same recursion with V = 0
and lam = 1, i.e. the discounted return G_t = sum_{k>=t} gamma^(k-t) r_k. Whitening (REINFORCE++
always, `gae` with `whiten`) is over every trained token of the step on every rank:
A <- (A - mean) / (std + eps), population std.
"""

from __future__ import annotations

import torch
from torch import Tensor

EPS = 1e-6


def token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float) -> Tensor:
    """r_t (float64): the batch's `rewards` minus kl_coef * KL_t on trained tokens (module docstring)."""
    out = rewards.double() * mask
    if kl is not None:
        out = out - kl_coef * kl.double() * mask
    return out


def gae(rewards: Tensor, values: Tensor, mask: Tensor, sample_lens: Tensor, gamma: float,
        lam: float) -> tuple[Tensor, Tensor]:
    """(A, G) [T] float64 of one packed row: the GAE recursion of the module docstring within each segment
    (`sample_lens`), over its trained tokens (`mask`) only; 0 off the mask."""
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
    a = torch.tensor(advantages, dtype=torch.float64)
    return a, (a + values.double().cpu()) * mask.cpu()


def whiten(values: list[Tensor], masks: list[Tensor], moments: list[float]) -> list[Tensor]:
    """(A - mean) / (std + eps) on the trained tokens of every row, 0 elsewhere; `moments` = [sum, sum of
    squares, count] of A over the trained tokens of the whole step (all rows, all ranks)."""
    total, squares, count = moments
    if count == 0:
        return values
    mean = total / count
    std = max(squares / count - mean * mean, 0.0) ** 0.5
    return [(a - mean) / (std + EPS) * m for a, m in zip(values, masks, strict=True)]


def moments(values: list[Tensor], masks: list[Tensor]) -> list[float]:
    """[sum, sum of squares, count] of the values on trained tokens (to all-reduce before `whiten`)."""
    picked = [a[m] for a, m in zip(values, masks, strict=True)]
    return [sum(float(p.sum()) for p in picked), sum(float(p.square().sum()) for p in picked),
            float(sum(p.numel() for p in picked))]

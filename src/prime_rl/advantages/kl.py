"""KL in the reward (`[orchestrator.advantage.reward_kl]`: `estimator`, `coef`; verl's `use_kl_in_reward`): the
reward minus coef times the KL to the frozen reference model (model.name), before the advantage. Only the trainer
has the reference, so it applies this for every type, from the per-token estimate KL_t [T] on the trained tokens
(the loss's `kl_estimate`, the same as its KL regularizer, with the sampler's logprob in place of the trainer's).
The formulas: docs/losses.md#token-level-advantages, docs/losses.md#kl-in-the-reward-for-the-group-types.

Trainer-computed types (`token_rewards`): the per-token rewards r_t minus the KL on every token (`token.py`).

Orchestrator-computed types (`kl_group_advantages`): each sample's reward (the batch's `sample_rewards`) minus
coef times its KL summed over its trained tokens, then the type's own function of each group's row (the one the
orchestrator runs on the task rewards), on every trained token.

A group's samples may sit on several ranks: every rank contributes (group, reward, KL sum) of its samples
(`sample_groups` >= 0, `sample_table`), all gather them, and each computes the same [groups, rollouts] table.
A sample that trains no token (a masked truncation) enters its group with its reward and no KL. A group has
as many samples as rollouts it trains: rollouts_per_example, or fewer for a partial group (a failed rollout left
out, `advantages.group`), which is then a group of that size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from prime_rl.advantages.group import group_advantages
from prime_rl.configs.advantage import AdvantageConfig


def token_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None, coef: float) -> Tensor:
    """r_t [T] float64: the batch's `rewards` minus coef * KL_t (`kl`: none without the option) on trained
    tokens, 0 elsewhere."""
    out = rewards.double() * mask
    if kl is not None:
        out = out - coef * kl.double() * mask
    return out


def sample_table(groups: Tensor, rewards: Tensor, kl_sums: Tensor) -> Tensor:
    """[N, 3] float64 rows (group, reward, KL sum) of the segments that are samples (group >= 0)."""
    keep = groups >= 0
    return torch.stack([groups[keep].double(), rewards[keep].double(), kl_sums[keep].double()], dim=1)


def kl_group_advantages(tables: list[Tensor], advantage: AdvantageConfig) -> list[Tensor]:
    """Per table (one per rank, rows as `sample_table`): A of each row under `advantage`, of its reward minus
    reward_kl.coef times its KL sum (module docstring), float64. The same on every rank given the same tables."""
    table = torch.cat(tables) if tables else torch.zeros((0, 3), dtype=torch.float64)
    if table.shape[0] == 0:
        return [torch.zeros(0, dtype=torch.float64) for _ in tables]
    ids, inverse, sizes = torch.unique(table[:, 0], return_inverse=True, return_counts=True)
    slot = torch.zeros_like(inverse)  # each row's column within its group, in gathered order
    seen = torch.zeros(len(ids), dtype=torch.long)
    for row, g in enumerate(inverse.tolist()):
        slot[row] = seen[g]
        seen[g] += 1
    penalized = torch.zeros((len(ids), int(sizes.max())), dtype=torch.float64)
    penalized[inverse, slot] = table[:, 1] - advantage.reward_kl.coef * table[:, 2]
    trained = torch.arange(int(sizes.max()))[None, :] < sizes[:, None]  # a partial group's columns past its size
    advantages = group_advantages(advantage, penalized, trained)[inverse, slot]
    return list(torch.split(advantages, [t.shape[0] for t in tables]))

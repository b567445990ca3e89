"""A step's groups to their advantages, and which groups carry no signal: the orchestrator's side of the
advantage types (the math is `prime_rl.advantages.group`).

The rewards of `groups` are a float64 `[groups, n]` tensor (n = `rollouts_per_example`, also for no groups):
equal groups are detected exactly on these values, so they are never rounded to float32 first. A type computed
here gives its advantages (float32); a type computed in the trainer gives 0 (the batch carries each sample's
reward instead). A group is zero-advantage when all its advantages are exactly 0: what `filter_zero_advantage`
and dynamic sampling drop, in both rollout modes.

Partial groups: a rollout that failed under `on_error = "exclude"` trains nothing (`Group.trains`); its group's
advantages are those of the rollouts left, as a group of that size (`advantages.group`). A group left with too few
to compare (fewer than 2 for a group-relative type, none otherwise) is not `usable`: it never trains, whatever the
filters, and dynamic sampling draws another in its place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prime_rl.advantages.group import compute_advantages, zero_groups
from prime_rl.configs.advantage import AdvantageConfig
from prime_rl.orchestrator.rollouts.scored_group import Group


@dataclass(frozen=True)
class GroupAdvantages:
    """The advantage type of the run and the group size: the advantages of any list of groups (module docstring).
    The orchestrator's `finish` and the collectors' filters ask it the same questions."""

    config: AdvantageConfig
    group_size: int  # rollouts per group (`rollouts_per_example`)

    def rewards(self, groups: list[Group]) -> torch.Tensor:
        """Float64 [groups, group_size]."""
        return torch.tensor([g.rewards for g in groups], dtype=torch.float64).reshape(len(groups), self.group_size)

    def trained(self, groups: list[Group]) -> torch.Tensor:
        """Bool [groups, group_size]: the rollouts that train (`Group.trains`)."""
        return torch.tensor([[g.trains(i) for i in range(len(g.rewards))] for g in groups],
                            dtype=torch.bool).reshape(len(groups), self.group_size)

    def usable(self, group: Group) -> bool:
        """Whether `group` has enough rollouts left to train (module docstring)."""
        left = sum(group.trains(i) for i in range(len(group.rewards)))
        return left >= (2 if self.config.compares_rollouts else 1)

    def of(self, groups: list[Group], normalize: bool = False) -> torch.Tensor:
        """Float32 [groups, group_size]: the type's advantages when computed here (whitened over the batch's trained
        rollouts with `normalize`; 0 at a rollout that does not train); 0 for a type computed in the trainer."""
        rewards = self.rewards(groups)
        if self.config.computed_in == "trainer":
            return torch.zeros_like(rewards, dtype=torch.float32)
        return compute_advantages(self.config, rewards, normalize, self.trained(groups))

    def zero(self, groups: list[Group]) -> list[bool]:
        """Per group: are its advantages all exactly 0 (nothing to learn from it)."""
        return zero_groups(self.of(groups)).tolist()

"""Advantages from rewards: pure functions on a [groups, rollouts] reward tensor.

Row g holds the rewards r_g1..r_gR of the R rollouts of one prompt. With
mean_g = (1/R) sum_j r_gj and the sample std std_g = sqrt(sum_j (r_gj - mean_g)^2 / (R - 1)):

    grpo                          A_gi = (r_gi - mean_g) / (std_g + eps)     (std_normalize = false: r_gi - mean_g)
    dr_grpo                       A_gi = r_gi - mean_g
    rloo                          A_gi = r_gi - (1/(R-1)) sum_{j != i} r_gj  =  R/(R-1) * (r_gi - mean_g)
    reinforce_plus_plus_baseline  a_gi = r_gi - mean_g, then A = (a - mean(a)) / (std(a) + eps) over the whole batch
    custom                        A = fn(rewards, **kwargs), same shape

`whiten` is the optional global normalisation (`normalize_advantages`) applied after any
type. A group whose rewards are all equal gets A = 0 under every built-in type.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from prime_rl.configs.loss import import_loss_function
from prime_rl.orchestrator.config import AdvantageConfig
from prime_rl.utils.errors import PrimeError

EPS = 1e-6


def _check_groups(rewards: Tensor, name: str) -> None:
    if rewards.ndim != 2:
        raise ValueError(f"{name}: rewards must be [groups, rollouts], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError(f"{name} needs at least 2 rollouts per example (got {rewards.shape[1]}): it compares them")


def _centered(rewards: Tensor) -> Tensor:
    return rewards - rewards.mean(dim=1, keepdim=True)


def grpo(rewards: Tensor, std_normalize: bool = True) -> Tensor:
    _check_groups(rewards, "grpo")
    centered = _centered(rewards)
    if not std_normalize:
        return centered
    return centered / (rewards.std(dim=1, keepdim=True) + EPS)


def dr_grpo(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "dr_grpo")
    return _centered(rewards)


def rloo(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "rloo")
    n = rewards.shape[1]
    # r_i - (sum - r_i) / (n - 1) == n / (n - 1) * (r_i - mean)
    return _centered(rewards) * (n / (n - 1))


def whiten(values: Tensor) -> Tensor:
    """(x - mean) / (std + eps) over all elements (population std; a single element gives 0)."""
    if values.numel() == 0:
        return values
    centered = values - values.mean()
    return centered / (values.std(correction=0) + EPS)


def reinforce_plus_plus_baseline(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "reinforce_plus_plus_baseline")
    return whiten(_centered(rewards))


def _custom(config) -> Callable[[Tensor], Tensor]:
    fn = import_loss_function(config.import_path)

    def call(rewards: Tensor) -> Tensor:
        result = fn(rewards, **config.kwargs)
        if not isinstance(result, Tensor) or result.shape != rewards.shape:
            got = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
            raise PrimeError(
                f"custom advantage {config.import_path} returned {got}, expected a tensor of shape {tuple(rewards.shape)}"
            )
        return result.float()

    return call


def advantage_fn(config: AdvantageConfig) -> Callable[[Tensor], Tensor]:
    """The function rewards [groups, rollouts] -> advantages [groups, rollouts] that `config` selects."""
    if config.type == "grpo":
        return lambda r: grpo(r, config.std_normalize)
    if config.type == "dr_grpo":
        return dr_grpo
    if config.type == "rloo":
        return rloo
    if config.type == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline
    if config.type == "custom":
        return _custom(config)
    raise ValueError(f"unknown advantage type {config.type!r}")


def compute_advantages(config: AdvantageConfig, rewards: Tensor, normalize: bool = False) -> Tensor:
    """Advantages of `rewards` [groups, rollouts] under `config`, optionally whitened over the batch."""
    if rewards.numel() == 0:  # every group filtered out: nothing to compute
        return torch.zeros_like(rewards, dtype=torch.float32)
    advantages = advantage_fn(config)(rewards.float())
    return whiten(advantages) if normalize else advantages


def zero_groups(advantages: Tensor, atol: float = 1e-8) -> Tensor:
    """Bool [groups]: the groups whose advantages are all (numerically) zero."""
    return (advantages.abs() <= atol).all(dim=1)


def pass_at_k(solved: Tensor) -> float:
    """Fraction of examples (rows of the bool [examples, k] tensor) with at least one solved rollout."""
    return float(solved.any(dim=1).float().mean()) if solved.numel() else 0.0

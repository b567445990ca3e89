"""The types computed in the orchestrator: pure functions on a [groups, rollouts] reward tensor (row g: the
rewards of the R rollouts of one prompt) that return advantages of the same shape: grpo, dr_grpo, rloo,
reinforce_plus_plus_baseline (group-centered, then `whiten_samples`) and custom (the user's function). Their
formulas: docs/orchestrator.md#advantages.

`whiten_samples` is also the optional normalisation over the batch (`normalize_advantages`) applied after
any of them, over every sample of the step. It is not `token.whiten_tokens`, which whitens a trainer-computed
type's per-token A over the step's trained tokens.

All of it is computed in float64 (the built-in functions return float64; `compute_advantages`
returns float32 for the batch file).

Equal groups. A group whose rewards are all equal (max == min, compared exactly, `equal_groups`) has
nothing to compare: every built-in type gives it A = 0 exactly, not the rounding residue of centering
(which grpo's std division would blow up), and `whiten_samples` keeps a group that is all exactly 0 at
exactly 0 (for group-centered values the batch mean is 0, so this only removes rounding). A group is zero-advantage
(`zero_groups`: what `filter_zero_advantage` and dynamic sampling drop) iff its advantages are all
exactly 0; for the built-in types that is iff its rewards are all equal.

A custom function's output is used as returned: it may use a fixed baseline or run with one rollout
per example, where a group of equal rewards does carry signal. It gets float64 rewards; a
group-relative custom function should return exact 0s on `equal_groups(rewards)` for those groups to
count as zero-advantage.
"""

from __future__ import annotations

import torch
from torch import Tensor

from prime_rl.configs.advantage import (
    ADVANTAGES,
    AdvantageConfig,
    CustomAdvantageConfig,
    DrGrpoAdvantageConfig,
    GrpoAdvantageConfig,
    RlooAdvantageConfig,
    RppBaselineAdvantageConfig,
)
from prime_rl.utils.errors import PrimeError
from prime_rl.utils.imports import import_callable

EPS = 1e-6
"""The eps added to every standard deviation the advantages are divided by (whitening, grpo)."""


def _check_groups(rewards: Tensor, name: str) -> None:
    if rewards.ndim != 2:
        raise ValueError(f"{name}: rewards must be [groups, rollouts], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ValueError(f"{name} needs at least 2 rollouts per example (got {rewards.shape[1]}): it compares them")


def equal_groups(rewards: Tensor) -> Tensor:
    """Bool [groups]: the groups whose rewards are all exactly equal (max == min, no tolerance)."""
    return rewards.amax(dim=1) == rewards.amin(dim=1)


def zero_groups(advantages: Tensor) -> Tensor:
    """Bool [groups]: the groups whose advantages are all exactly 0 (no learning signal).

    For the built-in types these are exactly the groups of equal rewards (module docstring).
    """
    return (advantages == 0).all(dim=1)


def _zero_rows(values: Tensor, rows: Tensor) -> Tensor:
    """`values` with the rows where `rows` [groups] is true set to exactly 0."""
    return values.masked_fill(rows[:, None], 0.0)


def _centered(rewards: Tensor) -> Tensor:
    """Each reward minus its group's mean, in float64; exactly 0 on equal groups."""
    rewards = rewards.double()
    return _zero_rows(rewards - rewards.mean(dim=1, keepdim=True), equal_groups(rewards))


@ADVANTAGES.implements(GrpoAdvantageConfig)
def grpo(rewards: Tensor, std_normalize: bool = True) -> Tensor:
    _check_groups(rewards, "grpo")
    centered = _centered(rewards)
    if not std_normalize:
        return centered
    return centered / (rewards.double().std(dim=1, keepdim=True) + EPS)


@ADVANTAGES.implements(DrGrpoAdvantageConfig)
def dr_grpo(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "dr_grpo")
    return _centered(rewards)


@ADVANTAGES.implements(RlooAdvantageConfig)
def rloo(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "rloo")
    n = rewards.shape[1]
    # The leave-one-out baseline, as n / (n - 1) times the centered reward (docs/orchestrator.md#advantages).
    return _centered(rewards) * (n / (n - 1))


def whiten_samples(values: Tensor) -> Tensor:
    """Whitens every sample's value over the whole [groups, rollouts] batch (population std;
    docs/orchestrator.md#advantages, `normalize_advantages`).

    Rows that are all exactly 0 stay exactly 0 (they are the no-signal groups; for
    group-centered values mean = 0 and this only removes rounding). A single element gives 0.
    """
    if values.numel() == 0:
        return values
    centered = values - values.mean()
    return _zero_rows(centered / (values.std(correction=0) + EPS), zero_groups(values))


@ADVANTAGES.implements(RppBaselineAdvantageConfig)
def reinforce_plus_plus_baseline(rewards: Tensor) -> Tensor:
    _check_groups(rewards, "reinforce_plus_plus_baseline")
    return whiten_samples(_centered(rewards))


@ADVANTAGES.implements(CustomAdvantageConfig)
def custom(rewards: Tensor, import_path: str, kwargs: dict) -> Tensor:
    """`fn(rewards, **kwargs)` of the function at `import_path`, checked to be a tensor of the rewards' shape."""
    result = import_callable(import_path)(rewards, **kwargs)
    if not isinstance(result, Tensor) or result.shape != rewards.shape:
        got = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
        raise PrimeError(f"custom advantage {import_path} returned {got}, "
                         f"expected a tensor of shape {tuple(rewards.shape)}")
    return result.double()


def compute_advantages(config: AdvantageConfig, rewards: Tensor, normalize: bool = False) -> Tensor:
    """Float32 advantages of `rewards` [groups, rollouts] under an orchestrator-computed `config`, optionally
    whitened over the batch (`whiten_samples`).

    Computed in float64 (a custom function gets float64 rewards); equal-reward groups give exactly 0 under
    the built-in types, also after whitening (module docstring). A trainer-computed type has no advantage
    here: a ValueError (the orchestrator writes 0 for it and sends the rewards).
    """
    if config.computed_in != "orchestrator":
        raise ValueError(f"advantage type '{config.type}' is computed in the {config.computed_in}, not from rewards "
                         "[groups, rollouts]")
    if rewards.numel() == 0:  # every group filtered out: nothing to compute
        return torch.zeros_like(rewards, dtype=torch.float32)
    advantages = config.function()(rewards.double())
    return (whiten_samples(advantages) if normalize else advantages).float()

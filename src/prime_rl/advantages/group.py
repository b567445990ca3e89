"""The types computed in the orchestrator: pure functions on a [groups, rollouts] reward tensor (row g: the
rewards of the R rollouts of one prompt) that return advantages of the same shape: grpo, dr_grpo, rloo,
reinforce_plus_plus_baseline (group-centered, then `whiten_samples`) and custom (the user's function). Their
formulas: docs/orchestrator.md#advantages.

`whiten_samples` is also the optional normalisation over the batch (`normalize_advantages`) applied after
any of them, over every sample of the step. It is not `token.whiten_tokens`, which whitens a trainer-computed
type's per-token A over the step's trained tokens.

All of it is computed in float64 (the built-in functions return float64; `compute_advantages`
returns float32 for the batch file).

Partial groups. A group may train on fewer than its R rollouts (the environment's `on_error = "exclude"`: a
failed rollout is left out, `orchestrator/rollouts/scoring.py`): `trained` [groups, rollouts] says which. Its advantages
are then those of its trained rollouts alone, as a group of that size (grpo's mean and std over the k left,
rloo's k / (k - 1)), and 0 at the excluded ones: the groups of one size k go through the type's function together
as a [groups, k] table (`group_advantages`). Whitening (`normalize_advantages`, REINFORCE++-baseline) is over
the trained rollouts only.

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


def whiten_samples(values: Tensor, trained: Tensor | None = None) -> Tensor:
    """Whitens every trained sample's value over the whole [groups, rollouts] batch (population std;
    docs/orchestrator.md#advantages, `normalize_advantages`); `trained` (bool, the same shape; None: all) leaves the
    others out of the mean and std and at exactly 0.

    Rows that are all exactly 0 stay exactly 0 (they are the no-signal groups; for
    group-centered values mean = 0 and this only removes rounding). A single element gives 0.
    """
    trained = torch.ones_like(values, dtype=torch.bool) if trained is None else trained
    if not trained.any():
        return torch.zeros_like(values)
    kept = values[trained]
    whitened = (values - kept.mean()) / (kept.std(correction=0) + EPS)
    return _zero_rows(whitened.masked_fill(~trained, 0.0), zero_groups(values))


@ADVANTAGES.implements(RppBaselineAdvantageConfig)
def reinforce_plus_plus_baseline(rewards: Tensor) -> Tensor:
    """Each group's rewards centered; the whitening over the batch is `compute_advantages`' (the type is
    `batch_whitened`), so that it runs over every trained sample also when groups differ in size."""
    _check_groups(rewards, "reinforce_plus_plus_baseline")
    return _centered(rewards)


@ADVANTAGES.implements(CustomAdvantageConfig)
def custom(rewards: Tensor, import_path: str, kwargs: dict) -> Tensor:
    """`fn(rewards, **kwargs)` of the function at `import_path`, checked to be a tensor of the rewards' shape."""
    result = import_callable(import_path)(rewards, **kwargs)
    if not isinstance(result, Tensor) or result.shape != rewards.shape:
        got = tuple(result.shape) if isinstance(result, Tensor) else type(result).__name__
        raise PrimeError(f"custom advantage {import_path} returned {got}, "
                         f"expected a tensor of shape {tuple(rewards.shape)}")
    if not bool(torch.isfinite(result).all()):  # e.g. a leave-one-out baseline over a partial group of one
        raise PrimeError(f"custom advantage {import_path} returned a value that is not finite for rewards of shape "
                         f"{tuple(rewards.shape)}")
    return result.double()


def group_advantages(config: AdvantageConfig, rewards: Tensor, trained: Tensor | None = None,
                     normalize: bool = False) -> Tensor:
    """Float64 advantages of `rewards` [groups, rollouts] under an orchestrator-computed `config`; `trained`
    (bool, the same shape; None: every rollout) marks the rollouts a partial group trains on (module docstring:
    the others get 0 and the rest are a group of their own size); whitened over the trained samples with
    `normalize` or when the type is `batch_whitened` (REINFORCE++-baseline).

    A trainer-computed type has no advantage here: a ValueError (the orchestrator writes 0 for it and sends the
    rewards).
    """
    if config.computed_in != "orchestrator":
        raise ValueError(f"advantage type '{config.type}' is computed in the {config.computed_in}, not from rewards "
                         "[groups, rollouts]")
    rewards = rewards.double()
    if rewards.numel() == 0:  # every group filtered out: nothing to compute
        return torch.zeros_like(rewards)
    if trained is None or bool(trained.all()):
        advantages = config.function()(rewards)
    else:
        advantages = _by_group_size(config.function(), rewards, trained)
    return whiten_samples(advantages, trained) if normalize or config.batch_whitened else advantages


def _by_group_size(function, rewards: Tensor, trained: Tensor) -> Tensor:
    """`function` (a type's, [groups, k] -> [groups, k]) on each group's trained rewards, the groups of one
    trained count k together; 0 at the rollouts not trained and in a group that trains none."""
    advantages = torch.zeros_like(rewards)
    counts = trained.sum(dim=1)
    for k in counts.unique().tolist():
        rows = (counts == k).nonzero().squeeze(1)
        if k == 0:
            continue
        values = function(torch.stack([rewards[g][trained[g]] for g in rows.tolist()]))
        for i, g in enumerate(rows.tolist()):
            advantages[g, trained[g]] = values[i]
    return advantages


def compute_advantages(config: AdvantageConfig, rewards: Tensor, normalize: bool = False,
                       trained: Tensor | None = None) -> Tensor:
    """`group_advantages` as float32 (the batch file's dtype).

    Computed in float64 (a custom function gets float64 rewards); equal-reward groups give exactly 0 under
    the built-in types, also after whitening (module docstring).
    """
    return group_advantages(config, rewards, trained, normalize).float()

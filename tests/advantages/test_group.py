"""The types computed in the orchestrator (`advantages/group.py`): the math on hand-computed groups, equal groups,
whitening over the batch, custom functions."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.advantages.group import (
    compute_advantages,
    dr_grpo,
    equal_groups,
    grpo,
    reinforce_plus_plus_baseline,
    rloo,
    whiten_samples,
    zero_groups,
)
from prime_rl.configs.advantage import (
    CustomAdvantageConfig,
    DrGrpoAdvantageConfig,
    GaeAdvantageConfig,
    GrpoAdvantageConfig,
    ReinforcePlusPlusAdvantageConfig,
    RlooAdvantageConfig,
    RppBaselineAdvantageConfig,
)
from prime_rl.utils.errors import PrimeError

REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 0.0]])


def close(got, expected):
    assert torch.allclose(got.float(), torch.tensor(expected, dtype=torch.float32), atol=1e-5), got


def test_grpo_by_hand():
    # Group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735 -> +-0.866.
    # Group 2: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 -> 1.5, -0.5.
    s = 0.5 / math.sqrt(1 / 3)
    close(grpo(REWARDS), [[s, -s, -s, s], [0, 0, 0, 0], [1.5, -0.5, -0.5, -0.5]])
    close(grpo(REWARDS, std_normalize=False), [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]])


def test_dr_grpo_is_the_centered_reward():
    close(dr_grpo(REWARDS), [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]])


def test_rloo_leaves_one_out():
    # Group 2, rollout 0: 1 - mean(0, 0, 0) = 1; rollout 1: 0 - mean(1, 0, 0) = -1/3.
    close(rloo(REWARDS), [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0, 0, 0, 0], [1, -1 / 3, -1 / 3, -1 / 3]])
    explicit = torch.stack([REWARDS[:, i] - (REWARDS.sum(1) - REWARDS[:, i]) / 3 for i in range(4)], dim=1)
    close(rloo(REWARDS), explicit.tolist())


def test_reinforce_plus_plus_baseline_whitens_the_centered_rewards_over_the_batch():
    centered = torch.tensor([[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]])
    # Batch mean of the centered values is 0; population std = sqrt(mean of squares).
    std = math.sqrt(float((centered**2).mean()))
    close(reinforce_plus_plus_baseline(REWARDS), centered.tolist())  # the function centers; the framework whitens
    got = compute_advantages(RppBaselineAdvantageConfig(), REWARDS)
    close(got, (centered / std).tolist())
    assert abs(float(got.mean())) < 1e-6 and abs(float(got.std(correction=0)) - 1) < 1e-4


def test_all_equal_rewards_give_zero_advantages_for_every_type():
    equal = torch.full((2, 4), 0.7)
    for fn in (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline):
        assert torch.equal(fn(equal), torch.zeros(2, 4)), fn.__name__
    assert zero_groups(grpo(REWARDS)).tolist() == [False, True, False]


# Rewards whose float32 group mean is off by an ulp (0.01, 0.1, 0.11, ...), and extremes.
EQUAL_REWARDS = [k / 100 for k in range(101)] + [1 / 3, 2 / 3, -0.7, 1e-9, -1e-9, 1e9, 123.456]
BUILTIN_CONFIGS = {
    "grpo": GrpoAdvantageConfig(),
    "grpo_no_std": GrpoAdvantageConfig(std_normalize=False),
    "dr_grpo": DrGrpoAdvantageConfig(),
    "rloo": RlooAdvantageConfig(),
    "rpp_baseline": RppBaselineAdvantageConfig(),
}


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("size", [2, 3, 4, 7, 8, 16, 64])
@pytest.mark.parametrize("name", BUILTIN_CONFIGS)
def test_equal_reward_groups_give_exactly_zero_and_are_flagged(name, size, normalize):
    # Every equal group shares the batch with one informative group (which must stay non-zero).
    equal = torch.tensor(EQUAL_REWARDS, dtype=torch.float64)[:, None].expand(-1, size)
    informative = torch.linspace(0, 1, size, dtype=torch.float64)[None]
    flags = [True] * len(EQUAL_REWARDS) + [False]
    for dtype in (torch.float32, torch.float64):  # the orchestrator hands over float32 rewards
        rewards = torch.cat([equal, informative]).to(dtype)
        assert equal_groups(rewards).tolist() == flags
        advantages = compute_advantages(BUILTIN_CONFIGS[name], rewards, normalize)
        nonzero = [v for v, row in zip(EQUAL_REWARDS, advantages[:-1].tolist(), strict=True) if any(row)]
        assert not nonzero, f"{dtype}: equal rewards {nonzero[:5]} give non-zero advantages"
        assert zero_groups(advantages).tolist() == flags
    # A batch of equal groups only (std 0 under whitening) is all zeros too.
    assert not compute_advantages(BUILTIN_CONFIGS[name], equal.float(), normalize).any()


def test_custom_advantages_are_used_as_returned_and_flagged_by_exact_zeros():
    equal_and_zero = torch.tensor([[0.1] * 8, [0.0] * 8, [0.0, 1.0] * 4])
    config = CustomAdvantageConfig(import_path=f"{__name__}:scaled_reward")
    advantages = compute_advantages(config, equal_and_zero)
    # A fixed-baseline function: the equal group of 0.1 carries signal, the one of 0.0 has none.
    assert torch.equal(advantages, equal_and_zero) and zero_groups(advantages).tolist() == [False, True, False]
    whitened = compute_advantages(config, equal_and_zero, normalize=True)
    assert zero_groups(whitened).tolist() == [False, True, False] and bool(whitened[0].ne(0).all())


@pytest.mark.parametrize("fn", [grpo, dr_grpo, rloo, reinforce_plus_plus_baseline])
def test_one_rollout_per_example_is_a_clear_error(fn):
    with pytest.raises(ValueError, match="needs at least 2 rollouts per example"):
        fn(torch.tensor([[1.0], [0.0]]))


def test_compute_advantages_dispatch_and_global_normalisation():
    close(compute_advantages(DrGrpoAdvantageConfig(), REWARDS), dr_grpo(REWARDS).tolist())
    close(compute_advantages(RlooAdvantageConfig(), REWARDS), rloo(REWARDS).tolist())
    close(compute_advantages(GrpoAdvantageConfig(std_normalize=False), REWARDS), dr_grpo(REWARDS).tolist())
    close(compute_advantages(RppBaselineAdvantageConfig(), REWARDS),
          whiten_samples(reinforce_plus_plus_baseline(REWARDS)).tolist())
    normalized = compute_advantages(GrpoAdvantageConfig(), REWARDS, normalize=True)
    close(normalized, whiten_samples(grpo(REWARDS)).tolist())
    assert abs(float(normalized.mean())) < 1e-6


def scaled_reward(rewards, scale=1.0):
    """A custom advantage for the test: the raw reward times a constant."""
    return rewards * scale


def wrong_shape(rewards):
    return rewards[:, :1]


def test_custom_advantage_by_import_path():
    config = CustomAdvantageConfig(import_path=f"{__name__}:scaled_reward", kwargs={"scale": 2.0})
    close(compute_advantages(config, REWARDS), (REWARDS * 2).tolist())
    bad = CustomAdvantageConfig(import_path=f"{__name__}.wrong_shape")
    with pytest.raises(PrimeError, match=r"returned \(3, 1\), expected a tensor of shape \(3, 4\)"):
        compute_advantages(bad, REWARDS)


@pytest.mark.parametrize("config", [GaeAdvantageConfig(), ReinforcePlusPlusAdvantageConfig()], ids=lambda c: c.type)
def test_a_type_computed_in_the_trainer_has_no_advantages_from_group_rewards(config):
    """The orchestrator dispatches on `computed_in` and writes 0 for these; asking for their group advantages is an
    error rather than a silent zero."""
    with pytest.raises(ValueError, match=f"'{config.type}' is computed in the trainer"):
        compute_advantages(config, REWARDS)


PARTIAL = torch.tensor([[True, True, True, False], [True] * 4, [False, True, False, True]])


@pytest.mark.parametrize("config", [GrpoAdvantageConfig(), DrGrpoAdvantageConfig(), RlooAdvantageConfig()],
                         ids=lambda c: c.type)
def test_a_partial_group_is_a_group_of_the_rollouts_it_trains(config):
    got = compute_advantages(config, REWARDS, trained=PARTIAL)
    fn = config.function()
    # Row 0 as a group of 3 (rloo: 3/2 times the centered reward), row 1 untouched, row 2 as a group of 2.
    close(got[0, :3], fn(REWARDS[:1, :3])[0].tolist())
    close(got[1], fn(REWARDS[1:2])[0].tolist())
    close(got[2, PARTIAL[2]], fn(REWARDS[2:, PARTIAL[2]])[0].tolist())
    assert got[~PARTIAL].eq(0).all()  # the excluded rollouts are exactly 0


def test_whitening_runs_over_the_trained_rollouts_only():
    centered = compute_advantages(DrGrpoAdvantageConfig(), REWARDS, trained=PARTIAL).double()
    kept = centered[PARTIAL]
    expected = ((centered - kept.mean()) / (kept.std(correction=0) + 1e-6)).masked_fill(~PARTIAL, 0)
    expected[1] = 0  # the equal group stays exactly 0
    for config, normalize in ((DrGrpoAdvantageConfig(), True), (RppBaselineAdvantageConfig(), False)):
        got = compute_advantages(config, REWARDS, normalize, trained=PARTIAL)
        close(got, expected.tolist())


SHAPES: list[tuple[int, ...]] = []


def recorded_double(rewards):
    SHAPES.append(tuple(rewards.shape))
    return rewards * 2


def test_a_custom_function_sees_partial_groups_in_tables_of_their_size():
    SHAPES.clear()
    config = CustomAdvantageConfig(import_path=f"{__name__}:recorded_double")
    got = compute_advantages(config, REWARDS, trained=PARTIAL)
    assert sorted(SHAPES) == [(1, 2), (1, 3), (1, 4)]
    assert torch.equal(got, (REWARDS * 2).masked_fill(~PARTIAL, 0))
    # A group that trains nothing gets 0 and the function is not asked.
    SHAPES.clear()
    assert not compute_advantages(config, REWARDS, trained=torch.zeros_like(PARTIAL)).any() and SHAPES == []

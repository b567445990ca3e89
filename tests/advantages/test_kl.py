"""KL in the reward (`advantages/kl.py`): per-token rewards r_t = R [t = n] - coef * KL_t for the types computed
in the trainer; r' = R - coef * sum_t KL_t per sample, then the group type's own function, the same answer
however the samples are split over ranks."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.advantages.kl import kl_group_advantages, sample_table, token_rewards
from prime_rl.advantages.token import gae
from prime_rl.configs.advantage import (
    GrpoAdvantageConfig,
    RewardKlConfig,
    RlooAdvantageConfig,
    RppBaselineAdvantageConfig,
)
from prime_rl.trainer.rl.losses import kl_estimate
from tests.advantages.test_token import LENS, MASK, REWARDS

# (group, reward, KL sum) of 2 groups x 3 samples, in the order a rank would list them
ROWS = torch.tensor([[0, 1.0, 0.0], [0, 1.0, 4.0], [0, 0.0, 2.0],
                     [1, 0.5, 1.0], [1, 0.5, 1.0], [1, 0.5, 3.0]], dtype=torch.float64)


def test_reinforce_plus_plus_returns_with_kl_in_reward_match_the_hand_computed_case():
    lq = torch.tensor([0, -1.0, -2.0, 0, -0.5, 0, -1.5, -0.2, -0.3])
    lref = torch.tensor([0, -1.5, -1.0, 0, -0.5, 0, -1.0, -0.4, -0.1])
    kl = kl_estimate(lq.double(), lref.double(), "k1") * MASK
    r = token_rewards(REWARDS, MASK, kl, 0.1)
    g = 0.95
    ret = gae(r, torch.zeros(9), MASK, LENS, g, 1.0)
    r1, r2 = -0.1 * 0.5, 1.0 - 0.1 * (-1.0)        # k1 = lq - lref
    r4, r6, r7, r8 = 0.0, -0.1 * (-0.5), -0.1 * 0.2, 0.5 - 0.1 * (-0.2)
    expected = [0, r1 + g * r2, r2, 0, r4 + g * r6 + g**2 * r7 + g**3 * r8, 0, r6 + g * r7 + g**2 * r8, r7 + g * r8,
                r8]
    torch.testing.assert_close(ret, torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0)  # float32 inputs


def test_kl_in_reward_uses_the_losss_k1_and_k3_finite_at_extreme_log_ratios():
    lq, lref = torch.tensor([-1.0, -2.0, -0.5, -300.0]).double(), torch.tensor([-1.5, -1.0, -0.5, -1.0]).double()
    d = lq - lref
    torch.testing.assert_close(kl_estimate(lq, lref, "k1"), d)
    expected = torch.tensor([math.exp(-x) + x - 1 for x in d[:3].tolist()], dtype=torch.float64)
    k3 = kl_estimate(lq, lref, "k3")
    torch.testing.assert_close(k3[:3], expected)
    assert bool((k3 >= 0).all()) and float(k3[2]) == 0.0
    assert math.isfinite(float(k3[3]))  # d = -299: exp(299) would be 1e130; the tangent continuation is finite
    mask = torch.ones(4, dtype=torch.bool)
    assert bool(torch.isfinite(gae(token_rewards(torch.zeros(4), mask, k3, 0.1), torch.zeros(4), mask,
                                   torch.tensor([4]), 1.0, 1.0)).all())


def test_grpo_compares_rewards_minus_the_kl_sum_within_each_group():
    config = GrpoAdvantageConfig(reward_kl=RewardKlConfig(estimator="k3", coef=0.25))
    (got,) = kl_group_advantages([ROWS], config)
    # r' = R - 0.25 * KL: group 0 [1.0, 0.0, -0.5], group 1 [0.25, 0.25, -0.25]; (r' - mean) / (sample std + 1e-6)
    for rows, penalized in ((slice(0, 3), [1.0, 0.0, -0.5]), (slice(3, 6), [0.25, 0.25, -0.25])):
        r = torch.tensor(penalized, dtype=torch.float64)
        assert torch.allclose(got[rows], (r - r.mean()) / (r.std() + 1e-6), atol=1e-12)
    # Equal task rewards (group 1) still differ by their KL: the group trains towards the reference.
    assert got[5] < 0 < got[3]


def test_without_kl_it_is_the_orchestrators_advantage_and_rloo_and_rpp_baseline_follow_their_formulas():
    rows = ROWS.clone()
    rows[:, 2] = 0.0
    (grpo,) = kl_group_advantages([rows], GrpoAdvantageConfig(reward_kl=RewardKlConfig(estimator="k1", coef=1.0)))
    assert torch.all(grpo[3:] == 0)  # an equal group is exactly 0, as the orchestrator gives it
    (rloo,) = kl_group_advantages([ROWS], RlooAdvantageConfig(reward_kl=RewardKlConfig(estimator="k1", coef=0.5)))
    r = torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)  # group 0: R - 0.5 * KL
    assert torch.allclose(rloo[:3], torch.stack([r[i] - (r.sum() - r[i]) / 2 for i in range(3)]))
    (rpp,) = kl_group_advantages([ROWS], RppBaselineAdvantageConfig(reward_kl=RewardKlConfig(estimator="k1", coef=0.5)))
    assert rpp.mean().abs() < 1e-9 and rpp.std(correction=0) == pytest.approx(1.0, abs=1e-5)  # whitened over all


def test_the_answer_does_not_depend_on_how_the_samples_are_split_over_ranks():
    config = GrpoAdvantageConfig(reward_kl=RewardKlConfig(estimator="k3", coef=0.25))
    (whole,) = kl_group_advantages([ROWS], config)
    order = [4, 0, 2, 5, 1, 3]  # groups scattered over two ranks, three rows each
    ranks = [ROWS[order[:3]], ROWS[order[3:]]]
    split = torch.cat(kl_group_advantages(ranks, config))
    assert torch.allclose(split, whole[order], atol=1e-12)
    assert [t.shape[0] for t in kl_group_advantages([ROWS[:0], ROWS], config)] == [0, 6]  # a rank with no sample
    assert kl_group_advantages([ROWS[:0]], config)[0].shape == (0,)


def test_a_partial_group_is_a_group_of_its_own_size():
    # Group 0 lost a rollout (a failure left out): its 2 samples, rewards minus 0.25 x KL = 0 and -0.5, are a group of
    # 2 (mean -0.25, sample std 0.5 / sqrt(2)); group 1 is what it is alone.
    config = GrpoAdvantageConfig(reward_kl=RewardKlConfig(estimator="k3", coef=0.25))
    (got,) = kl_group_advantages([ROWS[1:]], config)
    s = 0.25 / (0.5 / math.sqrt(2) + 1e-6)
    assert torch.allclose(got[:2], torch.tensor([s, -s], dtype=torch.float64))
    assert torch.equal(got[2:], kl_group_advantages([ROWS[3:]], config)[0])


def test_sample_table_keeps_the_segments_that_are_samples():
    groups, rewards, kls = (torch.tensor([-1, 0, 0, -1]), torch.tensor([0.0, 1.0, 0.5, 0.0]),
                            torch.tensor([0.0, 2.0, 3.0, 0.0]))
    assert sample_table(groups, rewards, kls).tolist() == [[0.0, 1.0, 2.0], [0.0, 0.5, 3.0]]

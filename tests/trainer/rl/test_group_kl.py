"""KL in the reward for the group advantage types (`trainer/rl/group_kl.py`): r' = R - kl_coef * sum_t KL_t per
sample, then the type's own group function; the same answer however the samples are split over ranks; the
orchestrator's batch carries each segment's group and reward."""

from __future__ import annotations

import pytest
import torch

from prime_rl.configs.advantage import GrpoAdvantageConfig, RlooAdvantageConfig, RppBaselineAdvantageConfig
from prime_rl.orchestrator.batch import Sample, pack_batch
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.rl.group_kl import group_advantages, sample_table
from prime_rl.utils.errors import UserError
from prime_rl.utils.sampling_rule import SamplingRule

# (group, reward, KL sum) of 2 groups x 3 samples, in the order a rank would list them
ROWS = torch.tensor([[0, 1.0, 0.0], [0, 1.0, 4.0], [0, 0.0, 2.0],
                     [1, 0.5, 1.0], [1, 0.5, 1.0], [1, 0.5, 3.0]], dtype=torch.float64)


def test_grpo_compares_rewards_minus_the_kl_sum_within_each_group():
    config = GrpoAdvantageConfig(kl_in_reward="k3", kl_coef=0.25)
    (got,) = group_advantages([ROWS], config)
    # r' = R - 0.25 * KL: group 0 [1.0, 0.0, -0.5], group 1 [0.25, 0.25, -0.25]; (r' - mean) / (sample std + 1e-6)
    for rows, penalized in ((slice(0, 3), [1.0, 0.0, -0.5]), (slice(3, 6), [0.25, 0.25, -0.25])):
        r = torch.tensor(penalized, dtype=torch.float64)
        assert torch.allclose(got[rows], (r - r.mean()) / (r.std() + 1e-6), atol=1e-12)
    # Equal task rewards (group 1) still differ by their KL: the group trains towards the reference.
    assert got[5] < 0 < got[3]


def test_without_kl_it_is_the_orchestrators_advantage_and_rloo_and_rpp_baseline_follow_their_formulas():
    rows = ROWS.clone()
    rows[:, 2] = 0.0
    (grpo,) = group_advantages([rows], GrpoAdvantageConfig(kl_in_reward="k1", kl_coef=1.0))
    assert torch.all(grpo[3:] == 0)  # an equal group is exactly 0, as the orchestrator gives it
    (rloo,) = group_advantages([ROWS], RlooAdvantageConfig(kl_in_reward="k1", kl_coef=0.5))
    r = torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64)  # group 0: R - 0.5 * KL
    assert torch.allclose(rloo[:3], torch.stack([r[i] - (r.sum() - r[i]) / 2 for i in range(3)]))
    (rpp,) = group_advantages([ROWS], RppBaselineAdvantageConfig(kl_in_reward="k1", kl_coef=0.5))
    assert rpp.mean().abs() < 1e-9 and rpp.std(correction=0) == pytest.approx(1.0, abs=1e-5)  # whitened over all


def test_the_answer_does_not_depend_on_how_the_samples_are_split_over_ranks():
    config = GrpoAdvantageConfig(kl_in_reward="k3", kl_coef=0.25)
    (whole,) = group_advantages([ROWS], config)
    order = [4, 0, 2, 5, 1, 3]  # groups scattered over two ranks, three rows each
    ranks = [ROWS[order[:3]], ROWS[order[3:]]]
    split = torch.cat(group_advantages(ranks, config))
    assert torch.allclose(split, whole[order], atol=1e-12)
    assert [t.shape[0] for t in group_advantages([ROWS[:0], ROWS], config)] == [0, 6]  # a rank with no sample
    assert group_advantages([ROWS[:0]], config)[0].shape == (0,)


def test_groups_of_different_sizes_are_refused_in_one_line():
    with pytest.raises(UserError, match="groups have 2 to 3 samples") as caught:
        group_advantages([ROWS[1:]], GrpoAdvantageConfig(kl_in_reward="k3"))
    assert "\n" not in str(caught.value)


def test_sample_table_keeps_the_segments_that_are_samples():
    groups, rewards, kls = torch.tensor([-1, 0, 0, -1]), torch.tensor([0.0, 1.0, 0.5, 0.0]), torch.tensor([0.0, 2.0, 3.0, 0.0])
    assert sample_table(groups, rewards, kls).tolist() == [[0.0, 1.0, 2.0], [0.0, 0.5, 3.0]]


def test_the_batch_carries_each_segments_group_and_reward_with_shared_prompts_or_not():
    samples = [Sample([5, 6, 7], [8, 9], [-0.1, -0.2], 0.3, 0, reward=r, group=g)
               for g, r in ((0, 1.0), (0, 0.0), (1, 0.5))]
    samples[2].prompt_ids = [4, 6, 7]  # another prompt
    for share in (True, False):
        (batch,) = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8, share, ("sample_groups",), "grpo")
        (mb,) = batch.micro_batches
        mb.validate()
        pairs = sorted(zip(mb.sample_groups.tolist(), mb.sample_rewards.tolist(), strict=True))
        roots = [(-1, 0.0)] if share else []  # the shared prompt's root segment is no sample
        assert pairs == sorted(roots + [(0, 0.0), (0, 1.0), (1, 0.5)]) and mb.rewards is None
    (plain,) = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8)
    assert plain.micro_batches[0].sample_groups is None and plain.micro_batches[0].sample_rewards is None


def test_kl_in_reward_for_a_group_type_refuses_what_needs_the_orchestrators_advantages():
    grpo = {"type": "grpo", "kl_in_reward": "k3"}
    assert GrpoAdvantageConfig(kl_in_reward="k3").arguments() == {"std_normalize": True}  # the trainer's fields
    OrchestratorConfig.build([], {"advantage": grpo, "filter_zero_advantage": True})  # on the task rewards
    with pytest.raises(Exception, match="normalize_advantages needs the orchestrator's"):
        OrchestratorConfig.build([], {"advantage": grpo, "normalize_advantages": True})
    with pytest.raises(Exception, match="teacher needs the orchestrator's"):
        OrchestratorConfig.build([], {"advantage": grpo, "teacher": {"model": {"name": "x"}}})


def test_a_trainer_whose_kl_in_reward_differs_from_the_orchestrators_is_refused_in_one_line():
    from prime_rl.trainer.rl.train import check_advantage_type

    samples = [Sample([5, 6], [8, 9], [-0.1, -0.2], 0.3, 0, reward=1.0, group=0)]
    folded = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8, True, ("sample_groups",), "grpo")[0]
    plain = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8, True, (), "grpo")[0]
    check_advantage_type(folded, GrpoAdvantageConfig(kl_in_reward="k3"))
    check_advantage_type(plain, GrpoAdvantageConfig())
    for batch, ours, words in ((folded, GrpoAdvantageConfig(), "the orchestrator runs advantage.kl_in_reward but "
                                                                "the trainer does not"),
                               (plain, GrpoAdvantageConfig(kl_in_reward="k1"), "does not run advantage.kl_in_reward "
                                                                               "but the trainer does")):
        with pytest.raises(UserError, match=words) as caught:
            check_advantage_type(batch, ours)
        assert "\n" not in str(caught.value)

"""The trainer's side of the advantages (`trainer/rl/step_advantages.py`) and what it relies on: the batch carries each
sample's reward (a type computed in the trainer) or its group and reward (a group type with `reward_kl`), the
configs that need the orchestrator's advantages are refused with those types, `rl` hands the advantage type to the
trainer, and a trainer whose advantage settings differ from the orchestrator's is refused in one line."""

from __future__ import annotations

import pytest
import torch

from prime_rl.configs.advantage import GrpoAdvantageConfig, RewardKlConfig
from prime_rl.launch.rl_config import RLConfig
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.batch import Sample, micro_batch, pack_batch
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import CriticConfig, TrainerConfig
from prime_rl.trainer.rl.step_advantages import check_advantage_plan
from prime_rl.utils.errors import UserError


def test_the_batch_carries_each_samples_reward_on_its_last_trained_token():
    # A multi-turn sample whose last token is the environment's: the reward sits on the last *trained* token.
    s = Sample([1, 2], [3, 4, 5, 6], [-0.1] * 4, 0.0, 0, completion_mask=[True, True, False, False], reward=0.75)
    untrained = Sample([1, 2], [7, 8], [-0.1] * 2, 0.0, 0, train=False, reward=0.5)
    mb = micro_batch([[s], [untrained]], ("rewards",))
    assert mb.rewards.tolist() == [0, 0, 0, 0.75, 0, 0, 0, 0, 0, 0]
    assert micro_batch([[s]]).rewards is None


def test_token_level_types_refuse_what_reads_the_orchestrators_advantages():
    for flag in ("filter_zero_advantage", "dynamic_sampling", "normalize_advantages"):
        with pytest.raises(Exception, match=f"computed per token by the trainer: {flag} needs"):
            RLConfig.build([], {"orchestrator": {"advantage": {"type": "gae"}, flag: True}})
    with pytest.raises(Exception, match="critic is used only by an advantage type with a critic"):
        RLConfig.build([], {"trainer": {"critic": {}}})
    with pytest.raises(Exception, match="set only \\[orchestrator.advantage\\]"):
        RLConfig.build([], {"trainer": {"advantage": {"type": "gae"}}})


def test_rl_hands_the_advantage_type_to_the_trainer_and_gae_gets_a_default_critic():
    config = RLConfig.build([], {"orchestrator": {"advantage": {"type": "gae", "lam": 0.9}}})
    assert config.trainer.advantage.type == "gae" and config.trainer.advantage.lam == 0.9
    assert config.trainer.critic_in_use == CriticConfig()
    # Not group-relative: one rollout per prompt is allowed.
    rpp_k3 = {"type": "reinforce_plus_plus", "reward_kl": {"estimator": "k3"}}
    rpp = RLConfig.build([], {"orchestrator": {"advantage": rpp_k3, "rollouts_per_example": 1, "batch_size": 4}})
    assert rpp.trainer.critic_in_use is None and rpp.trainer.advantage.reward_kl.estimator == "k3"
    assert TrainerConfig.build([], {}).critic_in_use is None


def test_a_critic_with_another_vocabulary_is_one_line(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from prime_rl.configs.shared import ModelConfig
    from prime_rl.trainer.config import RuntimeConfig
    from prime_rl.trainer.critic import SeparateCritic
    from prime_rl.trainer.dist import init_distributed
    from prime_rl.utils.errors import UserError

    init_distributed()
    other = tmp_path / "other"
    AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=120, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                                 head_dim=16)
                                     ).save_pretrained(other)
    with pytest.raises(UserError, match="has a vocabulary of 120 tokens, the policy 99") as caught:
        SeparateCritic(CriticConfig(model=str(other)), ModelConfig(name="tiny-reverse-text"), RuntimeConfig(),
               torch.device("cpu"), seed=0, vocab_size=99)
    assert "\n" not in str(caught.value)


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
    grpo = {"type": "grpo", "reward_kl": {"estimator": "k3"}}
    k3 = RewardKlConfig(estimator="k3")
    assert GrpoAdvantageConfig(reward_kl=k3).arguments() == {"std_normalize": True}  # the trainer's fields
    OrchestratorConfig.build([], {"advantage": grpo, "filter_zero_advantage": True})  # on the task rewards
    with pytest.raises(Exception, match="normalize_advantages needs the orchestrator's"):
        OrchestratorConfig.build([], {"advantage": grpo, "normalize_advantages": True})
    with pytest.raises(Exception, match="teacher needs the orchestrator's"):
        OrchestratorConfig.build([], {"advantage": grpo, "teacher": {"model": {"name": "x"}}})


def test_a_trainer_whose_kl_in_reward_differs_from_the_orchestrators_is_refused_in_one_line():
    samples = [Sample([5, 6], [8, 9], [-0.1, -0.2], 0.3, 0, reward=1.0, group=0)]
    folded = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8, True, ("sample_groups",), "grpo")[0]
    plain = pack_batch(samples, 64, 1, 0, SamplingRule(1.0), 8, True, (), "grpo")[0]
    check_advantage_plan(folded, GrpoAdvantageConfig(reward_kl=RewardKlConfig(estimator="k3")))
    check_advantage_plan(plain, GrpoAdvantageConfig())
    for batch, ours, words in (
            (folded, GrpoAdvantageConfig(), "the orchestrator runs advantage.reward_kl but the trainer does not"),
            (plain, GrpoAdvantageConfig(reward_kl=RewardKlConfig()),
             "does not run advantage.reward_kl but the trainer does")):
        with pytest.raises(UserError, match=words) as caught:
            check_advantage_plan(batch, ours)
        assert "\n" not in str(caught.value)

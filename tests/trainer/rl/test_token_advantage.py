"""Token-level advantages (`trainer/rl/token_advantage.py`): GAE and REINFORCE++ returns against cases worked
out by hand, the KL estimators, whitening; the configs that go with them."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.batch import Sample, micro_batch
from prime_rl.trainer.config import CriticConfig, TrainerConfig
from prime_rl.trainer.rl.loss import kl_estimate
from prime_rl.trainer.rl.token_advantage import gae, moments, token_rewards, whiten

# One packed row: segment 1 (3 tokens, trained 1-2, reward 1.0), segment 2 (6 tokens: a prompt token, a trained
# token, an environment token off the mask, three trained tokens; reward 0.5).
LENS = torch.tensor([3, 6])
MASK = torch.tensor([False, True, True, False, True, False, True, True, True])
REWARDS = torch.tensor([0, 0, 1.0, 0, 0, 0, 0, 0, 0.5])
V = torch.tensor([9.0, 0.2, 0.6, 9.0, 0.1, 9.0, 0.3, 0.4, 0.7])  # 9.0 off the mask: must never be read


def test_gae_matches_the_hand_computed_case():
    g, lam = 0.9, 0.8
    a, ret = gae(REWARDS, V, MASK, LENS, g, lam)
    a2 = 1.0 - 0.6                                   # last token of segment 1: delta = R - V
    a1 = (g * 0.6 - 0.2) + g * lam * a2
    a8 = 0.5 - 0.7
    a7 = (g * 0.7 - 0.4) + g * lam * a8
    a6 = (g * 0.4 - 0.3) + g * lam * a7
    a4 = (g * 0.3 - 0.1) + g * lam * a6              # token 5 is the environment's: skipped, not a state
    expected = torch.tensor([0, a1, a2, 0, a4, 0, a6, a7, a8], dtype=torch.float64)
    torch.testing.assert_close(a, expected, atol=1e-6, rtol=0)  # float32 inputs
    torch.testing.assert_close(ret, (expected + V.double()) * MASK, atol=1e-6, rtol=0)  # float32 inputs


def test_reinforce_plus_plus_returns_with_kl_in_reward_match_the_hand_computed_case():
    lq = torch.tensor([0, -1.0, -2.0, 0, -0.5, 0, -1.5, -0.2, -0.3])
    lref = torch.tensor([0, -1.5, -1.0, 0, -0.5, 0, -1.0, -0.4, -0.1])
    kl = kl_estimate(lq.double(), lref.double(), "k1") * MASK
    r = token_rewards(REWARDS, MASK, kl, 0.1)
    g = 0.95
    ret, _ = gae(r, torch.zeros(9), MASK, LENS, g, 1.0)
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
                                   torch.tensor([4]), 1.0, 1.0)[0]).all())


def test_whitening_uses_the_trained_tokens_of_the_whole_step():
    rows = [torch.tensor([5.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 7.0], dtype=torch.float64)]
    masks = [torch.tensor([False, True, True]), torch.tensor([True, False])]
    stats = moments(rows, masks)
    assert stats == [6.0, 14.0, 3.0]
    out = whiten(rows, masks, stats)
    std = math.sqrt(14 / 3 - 4)
    torch.testing.assert_close(torch.cat(out), torch.tensor([0, -1 / std, 0, 1 / std, 0], dtype=torch.float64),
                               atol=1e-5, rtol=0)


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
    with pytest.raises(Exception, match="critic is used only by advantage type 'gae'"):
        RLConfig.build([], {"trainer": {"critic": {}}})
    with pytest.raises(Exception, match="set only \\[orchestrator.advantage\\]"):
        RLConfig.build([], {"trainer": {"advantage": {"type": "gae"}}})


def test_rl_hands_the_advantage_type_to_the_trainer_and_gae_gets_a_default_critic():
    config = RLConfig.build([], {"orchestrator": {"advantage": {"type": "gae", "lam": 0.9}}})
    assert config.trainer.advantage.type == "gae" and config.trainer.advantage.lam == 0.9
    assert config.trainer.value_model == CriticConfig()
    # Not group-relative: one rollout per prompt is allowed.
    rpp = RLConfig.build([], {"orchestrator": {"advantage": {"type": "reinforce_plus_plus", "kl_in_reward": "k3"},
                                               "rollouts_per_example": 1, "batch_size": 4}})
    assert rpp.trainer.value_model is None and rpp.trainer.advantage.kl_in_reward == "k3"
    assert TrainerConfig.build([], {}).value_model is None


def test_a_critic_with_another_vocabulary_is_one_line(tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3Config

    from prime_rl.configs.shared import ModelConfig
    from prime_rl.trainer.config import RuntimeConfig
    from prime_rl.trainer.critic import Critic
    from prime_rl.trainer.dist import init_distributed
    from prime_rl.utils.errors import UserError

    init_distributed()
    other = tmp_path / "other"
    AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_attention_heads=2, num_key_value_heads=1, head_dim=16)
                                     ).save_pretrained(other)
    with pytest.raises(UserError, match="has a vocabulary of 120 tokens, the policy 99") as caught:
        Critic(CriticConfig(model=str(other)), ModelConfig(name="tiny-reverse-text"), RuntimeConfig(),
               torch.device("cpu"), seed=0, vocab_size=99)
    assert "\n" not in str(caught.value)

"""The types computed in the trainer (`advantages/token.py`): GAE and REINFORCE++ against cases worked out by
hand, with tokens off the mask skipped, and whitening over the step's trained tokens."""

from __future__ import annotations

import math

import torch

from prime_rl.advantages.token import (
    TokenRow,
    discounted_return,
    gae,
    generalized_advantage,
    token_moments,
    whiten_tokens,
)

# One packed row: segment 1 (3 tokens, trained 1-2, reward 1.0), segment 2 (6 tokens: a prompt token, a trained
# token, an environment token off the mask, three trained tokens; reward 0.5).
LENS = torch.tensor([3, 6])
MASK = torch.tensor([False, True, True, False, True, False, True, True, True])
REWARDS = torch.tensor([0, 0, 1.0, 0, 0, 0, 0, 0, 0.5])
V = torch.tensor([9.0, 0.2, 0.6, 9.0, 0.1, 9.0, 0.3, 0.4, 0.7])  # 9.0 off the mask: must never be read


def test_gae_matches_the_hand_computed_case():
    g, lam = 0.9, 0.8
    a2 = 1.0 - 0.6                                   # last token of segment 1: delta = R - V
    a1 = (g * 0.6 - 0.2) + g * lam * a2
    a8 = 0.5 - 0.7
    a7 = (g * 0.7 - 0.4) + g * lam * a8
    a6 = (g * 0.4 - 0.3) + g * lam * a7
    a4 = (g * 0.3 - 0.1) + g * lam * a6              # token 5 is the environment's: skipped, not a state
    expected = torch.tensor([0, a1, a2, 0, a4, 0, a6, a7, a8], dtype=torch.float64)
    torch.testing.assert_close(gae(REWARDS, V, MASK, LENS, g, lam), expected, atol=1e-6, rtol=0)  # float32 inputs
    row = TokenRow(REWARDS.double(), V.double(), MASK, LENS)
    assert torch.equal(generalized_advantage(row, gamma=g, lam=lam), gae(REWARDS, V, MASK, LENS, g, lam))


def test_reinforce_plus_plus_is_the_discounted_return_without_values():
    g = 0.95
    row = TokenRow(REWARDS.double(), V.double(), MASK, LENS)  # the critic's values are not REINFORCE++'s
    r2, r8 = 1.0, 0.5
    expected = [0, g * r2, r2, 0, g**3 * r8, 0, g**2 * r8, g * r8, r8]
    torch.testing.assert_close(discounted_return(row, gamma=g), torch.tensor(expected, dtype=torch.float64))


def test_whitening_uses_the_trained_tokens_of_the_whole_step():
    rows = [torch.tensor([5.0, 1.0, 2.0], dtype=torch.float64), torch.tensor([3.0, 7.0], dtype=torch.float64)]
    masks = [torch.tensor([False, True, True]), torch.tensor([True, False])]
    stats = token_moments(rows, masks)
    assert stats == [6.0, 14.0, 3.0]
    out = whiten_tokens(rows, masks, stats)
    std = math.sqrt(14 / 3 - 4)
    torch.testing.assert_close(torch.cat(out), torch.tensor([0, -1 / std, 0, 1 / std, 0], dtype=torch.float64),
                               atol=1e-5, rtol=0)

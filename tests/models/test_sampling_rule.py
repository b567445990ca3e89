"""The truncation rule (min_p, top_k, top_p) and the trainer scoring tokens under it: on the same logits
the trainer's logprob is the server's exactly, and off-policy it stays finite with finite gradients."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.inference.sampling import processed_logprobs
from prime_rl.models.sampling_rule import SamplingRule, kept_mask
from prime_rl.trainer.model import token_logprobs

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])  # p = 0.609, 0.224, 0.136, 0.030, 0.004


def kept(rule: SamplingRule, logits: torch.Tensor = LOGITS) -> list[int]:
    return kept_mask(logits / rule.temperature, rule).nonzero().flatten().tolist()


def test_min_p_keeps_tokens_within_a_factor_of_the_top():
    p = torch.softmax(LOGITS, -1)
    assert kept(SamplingRule(min_p=0.2)) == [0, 1, 2]  # 0.136 / 0.609 = 0.22 >= 0.2; 0.030 / 0.609 < 0.2
    assert kept(SamplingRule(min_p=float(p[1] / p[0]))) == [0, 1]  # exactly at the bound: kept
    assert kept(SamplingRule(min_p=1.0)) == [0]


def test_min_p_uses_the_tempered_distribution():
    # At T = 2 the ratios are square roots: 0.030 / 0.609 = 0.05 becomes 0.22.
    assert kept(SamplingRule(temperature=2.0, min_p=0.2)) == [0, 1, 2, 3]


def test_top_k_keeps_ties_with_the_kth():
    assert kept(SamplingRule(top_k=2)) == [0, 1]
    assert kept(SamplingRule(top_k=2), torch.tensor([3.0, 1.0, 1.0, 0.0])) == [0, 1, 2]
    assert kept(SamplingRule(top_k=5)) == [0, 1, 2, 3, 4]  # k >= V: off
    assert kept(SamplingRule(top_k=-1)) == [0, 1, 2, 3, 4]


def test_top_p_measures_mass_after_min_p_and_top_k():
    # Alone, top_p = 0.65 needs tokens 0, 1 (0.609 < 0.65). After top_k = 2 token 0's renormalised mass is
    # 0.609 / 0.833 = 0.731 >= 0.65: it alone is enough; 0.75 needs token 1 again.
    assert kept(SamplingRule(top_p=0.65)) == [0, 1]
    assert kept(SamplingRule(top_p=0.65, top_k=2)) == [0]
    assert kept(SamplingRule(top_p=0.75, top_k=2)) == [0, 1]
    # min_p = 0.3 leaves tokens 0, 1 (q = 0.731, 0.269): top_p = 0.72 needs only token 0 there, but
    # tokens 0, 1 of the full distribution (0.609 < 0.72).
    assert kept(SamplingRule(top_p=0.72)) == [0, 1]
    assert kept(SamplingRule(top_p=0.72, min_p=0.3)) == [0]
    assert kept(SamplingRule(top_p=1e-30)) == [0]  # rounds to 0 in float32: the top token still stays


@pytest.mark.parametrize("rule", [SamplingRule(top_k=3, min_p=0.1), SamplingRule(top_k=2, min_p=0.3),
                                  SamplingRule(top_k=4, min_p=0.01)])
def test_min_p_and_top_k_commute(rule):
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    both = kept_mask(logits, rule)
    assert torch.equal(both, kept_mask(logits, SamplingRule(top_k=rule.top_k)) & kept_mask(
        logits, SamplingRule(min_p=rule.min_p)))


def test_processed_logprobs_renormalise_over_the_kept_set():
    got = processed_logprobs(LOGITS, 1.0, top_k=3, top_p=0.99, min_p=0.1)
    keep = [0, 1, 2]  # min_p 0.1 drops token 3 (0.05 of the top) and 4; top_k 3 and top_p 0.99 then drop nothing
    expected = torch.full_like(LOGITS, -math.inf)
    expected[keep] = torch.log_softmax(LOGITS[keep], -1)
    torch.testing.assert_close(got, expected)
    assert math.isclose(float(got.exp().sum()), 1.0, rel_tol=1e-6)


RULES = [SamplingRule(0.8, top_p=0.9), SamplingRule(1.0, top_k=20), SamplingRule(1.2, min_p=0.05),
         SamplingRule(0.7, top_k=30, top_p=0.8, min_p=0.02), SamplingRule(1.0)]


def packed_row(seed: int, vocab: int = 64, length: int = 40):
    """Random logits [T, V] of one packed row of two samples, and tokens sampled from them as the server would:
    token t + 1 from position t's processed distribution."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(length, vocab, generator=gen) * 4
    return logits, torch.tensor([length // 2, length - length // 2]), gen


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_trainer_scores_tokens_exactly_as_the_server_sampled_them(rule):
    logits, lens, gen = packed_row(1)
    server = processed_logprobs(logits, rule.temperature, rule.top_k, rule.top_p, rule.min_p)
    ids = torch.cat([torch.zeros(1, dtype=torch.long), torch.multinomial(server[:-1].exp(), 1, generator=gen)[:, 0]])
    lp, ent = token_logprobs(logits, ids, lens, rule)
    expected = server[:-1].gather(-1, ids[1:, None])[:, 0]
    expected[lens[0] - 1] = 0.0  # the second segment's first token: nothing predicts it
    assert torch.equal(lp[1:], expected)  # the same float ops on the same logits: bitwise
    q = server[:-1].exp()
    entropy = -(q * server[:-1].masked_fill(q == 0, 0.0)).sum(-1)
    entropy[lens[0] - 1] = 0.0
    torch.testing.assert_close(ent[1:], entropy)


def test_without_matching_the_full_softmax_is_off_by_the_kept_mass():
    logits, lens, gen = packed_row(2)
    rule = SamplingRule(top_p=0.9)
    server = processed_logprobs(logits, 1.0, top_p=0.9)
    ids = torch.cat([torch.zeros(1, dtype=torch.long), torch.multinomial(server[:-1].exp(), 1, generator=gen)[:, 0]])
    matched, _ = token_logprobs(logits, ids, lens, rule)
    full, _ = token_logprobs(logits, ids, lens, SamplingRule())
    kept_mass = torch.logsumexp(logits[:-1].masked_fill(~kept_mask(logits[:-1], rule), -math.inf), -1) - \
        torch.logsumexp(logits[:-1], -1)
    kept_mass[lens[0] - 1] = 0.0
    torch.testing.assert_close(full[1:] - matched[1:], kept_mass)
    assert (full[1:] - matched[1:]).min() < -1e-3


def test_a_token_outside_the_trainers_kept_set_gets_a_finite_logprob_and_gradient():
    """Off-policy the sampled token may be one the current policy truncates: it joins the kept set."""
    logits = torch.tensor([[5.0, 4.0, 0.0, -2.0], [0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    ids = torch.tensor([0, 3])  # token 3 after position 0, where top_k = 2 keeps only tokens 0 and 1
    lens = torch.tensor([2])
    lp, ent = token_logprobs(logits, ids, lens, SamplingRule(top_k=2))
    scaled = logits.detach()[0]
    assert math.isclose(float(lp[1].detach()), float(scaled[3] - torch.logsumexp(scaled[[0, 1, 3]], -1)), rel_tol=1e-6)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 2] == 0  # a token outside the kept set carries no gradient


def test_gradients_stay_finite_with_truncated_entropy():
    logits, lens, gen = packed_row(3)
    logits.requires_grad_(True)
    rule = SamplingRule(top_k=5, top_p=0.7)
    ids = torch.randint(0, 64, (40,), generator=gen)
    lp, ent = token_logprobs(logits, ids, lens, rule)
    (lp.sum() - ent.sum()).backward()
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(logits.grad).all()


def test_ties_at_the_edge_of_top_p_keep_the_lowest_token_ids():
    # p = [0.45, 0.16, 0.16, 0.16, 0.06]: top_p 0.6 needs one of the three tied tokens; the first one stays.
    assert kept(SamplingRule(top_p=0.6), torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0])) == [0, 1]
    assert kept(SamplingRule(top_p=0.7), torch.tensor([2.0, 1.0, 1.0, 1.0, 0.0])) == [0, 1, 2]

"""The sampling distribution the builtin engine reports logprobs for."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.inference.sampling import processed_logprobs, sample, sample_rows

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])


def test_temperature_only_is_the_trainers_log_softmax():
    got = processed_logprobs(LOGITS, temperature=0.7)
    assert torch.allclose(got, torch.log_softmax(LOGITS / 0.7, dim=-1))


def test_greedy_reports_untempered_logprobs_and_takes_argmax():
    got = processed_logprobs(LOGITS, temperature=0.0)
    assert torch.allclose(got, torch.log_softmax(LOGITS, dim=-1))
    assert sample(got, 0.0, None) == 0


def test_top_k_renormalises_over_the_k_best():
    got = processed_logprobs(LOGITS, temperature=1.0, top_k=2)
    assert torch.isinf(got[2:]).all()
    expected = torch.log_softmax(LOGITS[:2], dim=-1)
    assert torch.allclose(got[:2], expected)
    assert math.isclose(float(got.exp().sum()), 1.0, rel_tol=1e-6)


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = torch.softmax(LOGITS, dim=-1)  # ~[0.61, 0.22, 0.14, 0.03, 0.004]
    top_p = float(probs[0] + probs[1]) - 1e-3  # needs the first two tokens
    got = processed_logprobs(LOGITS, temperature=1.0, top_p=top_p)
    assert torch.isfinite(got[:2]).all() and torch.isinf(got[2:]).all()
    assert torch.allclose(got[:2], torch.log_softmax(LOGITS[:2], dim=-1))
    # A tiny top_p still keeps the most likely token.
    only_top = processed_logprobs(LOGITS, temperature=1.0, top_p=0.01)
    assert float(only_top[0]) == pytest.approx(0.0, abs=1e-6) and torch.isinf(only_top[1:]).all()


def test_sampling_is_seeded_and_follows_the_distribution():
    logprobs = processed_logprobs(LOGITS, temperature=1.0)
    draws = [sample(logprobs, 1.0, torch.Generator().manual_seed(s)) for s in range(2000)]
    again = [sample(logprobs, 1.0, torch.Generator().manual_seed(s)) for s in range(2000)]
    assert draws == again
    freq = torch.bincount(torch.tensor(draws), minlength=5).float() / len(draws)
    assert torch.allclose(freq, logprobs.exp(), atol=0.04)


def test_batched_rows_are_seeded_per_row_and_never_draw_dropped_tokens():
    logprobs = processed_logprobs(LOGITS.repeat(3, 1), temperature=1.0, top_k=2)
    assert torch.isinf(logprobs[:, 2:]).all()
    draws = torch.stack([sample_rows(logprobs, 1.0, [torch.Generator().manual_seed(s + i) for i in range(3)])
                         for s in range(0, 3000, 3)])
    assert set(draws.flatten().tolist()) <= {0, 1}  # only the top-k set
    freq = torch.bincount(draws.flatten(), minlength=5).float() / draws.numel()
    assert torch.allclose(freq, logprobs[0].exp(), atol=0.04)
    # A row's draw depends only on its own generator, not on the other rows of the batch.
    alone = sample(logprobs[1], 1.0, torch.Generator().manual_seed(7))
    assert int(sample_rows(logprobs, 1.0, [None, torch.Generator().manual_seed(7), None])[1]) == alone
    assert sample_rows(logprobs, 0.0, [None] * 3).tolist() == [0, 0, 0]


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-45, 1e-30, 1e-8, 1e-3, 9.99e-3])
def test_tiny_temperatures_tend_to_the_argmax_and_never_give_nan(temperature):
    logits = torch.stack([LOGITS, LOGITS * 1e4, torch.tensor([3.0, 3.0, 1.0, 0.0, -1.0])])  # large logits; a tie
    for top_k, top_p in ((-1, 1.0), (2, 1.0), (-1, 0.9)):
        got = processed_logprobs(logits, temperature, top_k, top_p)
        assert not torch.isnan(got).any()
        tokens = sample_rows(got, temperature, [torch.Generator().manual_seed(s) for s in range(3)])
        assert torch.isfinite(got.gather(1, tokens[:, None])).all()
    got = processed_logprobs(logits, temperature)
    if temperature < 1e-6:
        assert got[0, 0] == 0 and got[1, 0] == 0 and (got[:2, 1:] < -1e6).all()  # a point mass on the argmax
        assert torch.allclose(got[2, :2], torch.full((2,), -math.log(2)))  # a tie splits the mass evenly


def test_small_temperature_is_the_same_distribution_as_dividing():
    got = processed_logprobs(LOGITS, temperature=5e-3)
    assert torch.allclose(got, torch.log_softmax(LOGITS.double() / 5e-3, dim=-1).float(), atol=1e-5)


@pytest.mark.parametrize("top_p", [1e-300, 1e-50, 1e-8])
def test_a_top_p_that_rounds_to_zero_still_keeps_the_top_token(top_p):
    got = processed_logprobs(LOGITS.repeat(2, 1), temperature=1.0, top_p=top_p)
    assert (got[:, 0] == 0).all() and torch.isinf(got[:, 1:]).all()
    assert sample_rows(got, 1.0, [torch.Generator().manual_seed(0), None]).tolist() == [0, 0]

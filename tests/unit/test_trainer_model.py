"""Packed rows: block-diagonal mask isolates samples; logprobs at temperature T are log_softmax(logits / T)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.trainer.model import (
    compute_logprobs,
    forward_rows_logits,
    packed_attention_mask,
    token_logprobs,
)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return net.eval()


def samples(lengths, vocab=99, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


def packed(parts):
    ids = torch.cat(parts)
    pos = torch.cat([torch.arange(len(p)) for p in parts])
    lens = torch.tensor([len(p) for p in parts])
    return ids, pos, lens


def test_mask_is_block_diagonal_causal():
    mask = packed_attention_mask(torch.tensor([2, 3]), torch.device("cpu"))[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


@torch.no_grad()
def test_packed_logprobs_equal_separate_runs(model):
    parts = samples([7, 12, 5, 9])
    lp, ent = compute_logprobs(model, *packed(parts))
    offset = 0
    for part in parts:
        alone_lp, alone_ent = compute_logprobs(model, *packed([part]))
        n = len(part)
        torch.testing.assert_close(lp[offset:offset + n], alone_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[offset:offset + n], alone_ent, atol=1e-5, rtol=0)
        assert lp[offset] == 0 and ent[offset] == 0  # a sample's first token is predicted by nothing
        offset += n
    # Without the mask (position ids only) the packed samples leak into each other.
    ids, pos, _ = packed(parts)
    leaky = model(input_ids=ids[None], position_ids=pos[None]).logits[0].float()
    leaky_lp, _ = token_logprobs(leaky, ids, pos)
    assert (leaky_lp - lp).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_logprobs_at_temperature_match_direct_computation(model, temperature):
    (ids,) = samples([16], seed=1)
    lp, ent = compute_logprobs(model, *packed([ids]), temperature=temperature)
    logits = model(input_ids=ids[None]).logits[0].float()
    direct = torch.log_softmax(logits / temperature, dim=-1)
    expected = direct[:-1].gather(-1, ids[1:, None]).squeeze(-1)
    torch.testing.assert_close(lp[1:], expected, atol=1e-5, rtol=0)
    expected_ent = -(direct.exp() * direct).sum(-1)[:-1]
    torch.testing.assert_close(ent[1:], expected_ent, atol=1e-5, rtol=0)


@torch.no_grad()
def test_rows_of_different_lengths_in_one_forward(model):
    rows = [packed(samples([5, 8], seed=2)), packed(samples([20], seed=3)), packed(samples([3, 3, 4], seed=4))]
    together = forward_rows_logits(model, rows)
    for row, logits in zip(rows, together, strict=True):
        alone = forward_rows_logits(model, [row])[0]
        assert logits.shape == alone.shape
        torch.testing.assert_close(logits, alone, atol=1e-5, rtol=0)

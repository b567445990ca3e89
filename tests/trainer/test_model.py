"""Packed rows: units never see each other, shared prompts compute what the full samples compute alone,
every attention layout gives the same logprobs; logprobs at temperature T are log_softmax(logits / T)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.batch import Sample, micro_batch
from prime_rl.trainer.attention_layout import flash_layout, padded_layout
from prime_rl.trainer.model import (
    compute_logprobs,
    compute_rows_logprobs,
    forward_rows_logits,
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


def test_padded_mask_is_tree_causal_within_units():
    # Row: a lone sample of 2 tokens, then a unit: root of 2 tokens + two branches of 2 tokens.
    ids = torch.arange(8)
    pos = torch.tensor([0, 1, 0, 1, 2, 3, 2, 3])
    layout = padded_layout([(ids, pos, torch.tensor([2, 2, 2, 2]))])
    assert layout.input_ids.shape == (2, 6)  # W = the longest unit; the lone sample fills the second row
    unit = layout.attention_mask[0, 0]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],  # branch 1 sees the root and itself
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],  # branch 2 sees the root, not branch 1
        [1, 1, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(unit, expected)
    lone = layout.attention_mask[1, 0]
    assert torch.equal(lone[:2, :2], torch.tensor([[1, 0], [1, 1]], dtype=torch.bool))
    assert not lone[:2, 2:].any() and not lone[2:, :2].any()  # padding and the sample never meet
    assert lone[2:, 2:].diagonal().all()  # padding rows are never fully masked
    flat = layout.input_ids.flatten()
    assert torch.equal(flat[layout.index[0]], ids)


def shared_prompt_row(prompt_len: int, completion_lens: list[int], seed: int):
    """A row holding one prompt shared by several completions, and the full samples it stands for."""
    prompt, *completions = samples([prompt_len, *completion_lens], seed=seed)
    mb = micro_batch([[Sample(prompt.tolist(), c.tolist(), [-1.0] * len(c), 1.0, 0) for c in completions]])
    return (mb.input_ids, mb.position_ids, mb.sample_lens), mb.loss_mask, [torch.cat([prompt, c]) for c in completions]


def flash_layout_on_cpu(model, rows):
    """`flash_layout`'s packed row run with the block-diagonal mask the varlen kernel derives from its
    restarting position ids (flash-attn itself needs a GPU: tests/test_gpu.py)."""
    layout = flash_layout(rows)
    pos = layout.position_ids[0]
    seg = torch.cumsum(pos == 0, 0)
    mask = (seg[:, None] == seg[None, :]) & torch.ones(len(pos), len(pos), dtype=torch.bool).tril()
    flat = model(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=mask[None, None],
                 logits_to_keep=layout.keep).logits[0]
    assert len(flat) == sum(len(r[0]) for r in rows) < layout.input_ids.shape[1]  # no logits for repeated roots
    return [flat[index].float() for index in layout.index]


@torch.no_grad()
@pytest.mark.parametrize("layout", ["sdpa", "eager", "flash"])
def test_shared_prompt_logprobs_equal_the_full_samples_alone(model, tiny_model_dir, layout):
    """Every attention path: sdpa and eager (padded units, shared roots), flash_attention_2's layout."""
    row, loss_mask, full = shared_prompt_row(9, [4, 1, 7], seed=5)
    lone = packed(samples([6], seed=6))
    rows = [row, lone]
    if layout == "flash":
        logits = flash_layout_on_cpu(model, rows)
    else:
        net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=layout)
        logits = forward_rows_logits(net.eval(), rows)
    lp, ent = token_logprobs(logits[0], row[0], row[2])
    trained = loss_mask.nonzero().flatten().tolist()
    expected_lp, expected_ent = [], []
    for sample in full:
        alone_lp, alone_ent = compute_logprobs(model, *packed([sample]))
        n = len(sample) - 9
        expected_lp.append(alone_lp[-n:])
        expected_ent.append(alone_ent[-n:])
    torch.testing.assert_close(lp[trained], torch.cat(expected_lp), atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[trained], torch.cat(expected_ent), atol=1e-5, rtol=0)
    assert (lp[row[2].cumsum(0) - row[2]] == 0).all()  # every segment's first token is predicted by nothing
    lone_lp, _ = token_logprobs(logits[1], lone[0], lone[2])
    torch.testing.assert_close(lone_lp, compute_logprobs(model, *lone)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])  # flash_attention_2 (GPU only): its logprobs in test_gpu.py
def test_shared_prompt_gradients_equal_the_full_samples_alone(tiny_model_dir, attn):
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)
    row, loss_mask, full = shared_prompt_row(7, [3, 5], seed=7)
    (lp, _), = compute_rows_logprobs(net, [row])
    lp[loss_mask].sum().backward()
    shared = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    for sample in full:
        (alone, _), = compute_rows_logprobs(net, [packed([sample])])
        alone[7:].sum().backward()
    for got, expected in zip(shared, [p.grad for p in net.parameters()], strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


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
    leaky_lp, _ = token_logprobs(leaky, ids, torch.tensor([len(p) for p in parts]))
    assert (leaky_lp - lp).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_logprobs_at_temperature_match_direct_computation(model, temperature):
    (ids,) = samples([16], seed=1)
    lp, ent = compute_logprobs(model, *packed([ids]), rule=SamplingRule(temperature))
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


@torch.no_grad()
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rows_of_one_whole_sample_need_no_mask_and_score_as_with_one(tiny_model_dir, attn):
    """A layout whose every row is one sample (long rollouts) is plain causal: no [B, 1, W, W] mask is built, and
    the logprobs equal those of the same forward with the explicit mask."""
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn).eval()
    rows = [packed(samples([40], seed=1)), packed(samples([40], seed=2))]
    layout = padded_layout(rows)
    assert layout.attention_mask is None
    lp = [lp for lp, _ in compute_rows_logprobs(net, rows)]
    explicit = torch.ones(2, 1, 40, 40, dtype=torch.bool).tril()
    if attn == "eager":
        explicit = torch.zeros(explicit.shape).masked_fill(~explicit, torch.finfo(torch.float32).min)
    logits = net(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=explicit).logits
    for r, (ids, _, lens) in enumerate(rows):
        torch.testing.assert_close(lp[r], token_logprobs(logits[r], ids, lens)[0], atol=1e-5, rtol=0)
    assert padded_layout([rows[0], packed(samples([20], seed=3))]).attention_mask is not None  # padding: a mask

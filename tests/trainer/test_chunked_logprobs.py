"""The chunked LM head: logprobs, entropies and their gradients equal the full-logits computation for every
sampling rule, chunk size and sampled vocabulary, and a model scored through it equals the same model scored
from its logits (every layout, shared prompts included). "Equal" is to 1e-6 absolute and relative: a
matrix product over a chunk of rows may round the last float32 bit unlike one over all rows."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.models.output_head import head_output_is_logits
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer import model as trainer_model
from prime_rl.trainer.attention_layout import flash_layout
from prime_rl.trainer.chunked_logprobs import chunk_tokens, token_stats
from prime_rl.trainer.model import compute_logprobs_and_hidden, forward_rows, score_rows, token_logprobs
from prime_rl.utils.errors import UserError

RULES = [
    SamplingRule(),
    SamplingRule(temperature=0.7),
    SamplingRule(temperature=1.3, top_k=5),
    SamplingRule(temperature=0.9, top_p=0.8),
    SamplingRule(temperature=1.0, min_p=0.05),
    SamplingRule(temperature=0.6, top_k=20, top_p=0.9, min_p=0.01),
    SamplingRule(temperature=1.0, vocab=37),  # rows 37.. are padding: never sampled
    SamplingRule(temperature=0.8, top_p=0.7, vocab=41),
]


def full_stats(hidden, weight, bias, targets, rule):
    """`model.token_logprobs` of the full logits, per position (no segment starts: every position scored)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    ids = torch.cat([targets.new_zeros(1), targets])  # token t + 1 is predicted by position t
    lp, ent = token_logprobs(torch.cat([logits, logits[-1:]]), ids, torch.tensor([len(ids)]), rule)
    return lp[1:], ent[1:]


def leaves(n=23, hidden=16, vocab=50, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, hidden, generator=g) * 2).requires_grad_()
    w = torch.randn(vocab, hidden, generator=g).requires_grad_()
    b = torch.randn(vocab, generator=g).requires_grad_() if bias else None
    targets = torch.randint(0, 37, (n,), generator=g)
    return h, w, b, targets


@pytest.mark.parametrize("rule", RULES, ids=str)
@pytest.mark.parametrize("chunk", [1, 4, 7, 23, 100])
def test_chunked_stats_and_gradients_equal_the_full_logits(rule, chunk):
    h, w, b, targets = leaves()
    g = torch.Generator().manual_seed(1)
    coef_lp, coef_ent = torch.randn(len(targets), generator=g), torch.randn(len(targets), generator=g)

    lp, ent = token_stats(h, w, b, targets, rule, chunk=chunk)
    (lp * coef_lp + ent * coef_ent).sum().backward()
    got = [h.grad.clone(), w.grad.clone(), b.grad.clone()]
    for t in (h, w, b):
        t.grad = None
    full_lp, full_ent = full_stats(h, w, b, targets, rule)
    (full_lp * coef_lp + full_ent * coef_ent).sum().backward()

    torch.testing.assert_close(lp, full_lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, full_ent, atol=1e-6, rtol=1e-6)
    for mine, theirs in zip(got, [h.grad, w.grad, b.grad], strict=True):
        torch.testing.assert_close(mine, theirs, atol=3e-5, rtol=1e-5)
    if rule.vocab is not None:
        assert (w.grad[rule.vocab:] == 0).all() and (b.grad[rule.vocab:] == 0).all()  # padded rows: untouched


def test_an_unused_entropy_costs_no_gradient_and_unused_outputs_give_none():
    h, w, _, targets = leaves(bias=False)
    lp, _ = token_stats(h, w, None, targets, SamplingRule(top_k=3), entropies=False, chunk=5)
    lp.sum().backward()
    full_lp, _ = full_stats(h.detach(), w.detach(), None, targets, SamplingRule(top_k=3))
    torch.testing.assert_close(lp, full_lp, atol=1e-6, rtol=1e-6)
    assert w.grad is not None and h.grad is not None


def test_a_far_tempered_extreme_stays_finite():
    """A tiny temperature and huge logits: the logsumexp form never overflows into NaN."""
    h, w, b, targets = leaves()
    lp, ent = token_stats(h * 100, w, b, targets, SamplingRule(temperature=1e-3), chunk=3)
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(h.grad).all() and torch.isfinite(w.grad).all()


def test_chunks_hold_a_bounded_number_of_logits():
    assert chunk_tokens(151_936) == 220  # Qwen3: 220 x 151,936 float32 = 134 MB per copy
    assert chunk_tokens(10**9) == 1  # one token per chunk, whatever the vocabulary
    assert chunk_tokens(99) > 300_000


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="sdpa")


def rows_with_shared_prompt():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 85, (21,), generator=g)  # < every rule's vocab
    # a lone sample of 6, then a root of 5 with branches of 4 and 6 (the orchestrator's shared prompts)
    pos = torch.tensor([*range(6), *range(5), *range(5, 9), *range(5, 11)])
    lens = torch.tensor([6, 5, 4, 6])
    lone = torch.randint(0, 85, (9,), generator=g)
    return [(ids, pos, lens), (lone, torch.arange(9), torch.tensor([9]))]


@pytest.mark.parametrize("rule", [SamplingRule(), SamplingRule(temperature=0.8, top_p=0.9), SamplingRule(vocab=90)],
                         ids=str)
def test_a_model_scored_through_the_chunked_head_equals_its_full_logits(model, rule):
    assert head_output_is_logits(model)
    rows = rows_with_shared_prompt()
    chunked, _ = score_rows(model, rows, rule)
    loss = sum((lp * (k + 1)).sum() + ent.sum() for k, (lp, ent) in enumerate(chunked))
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    logits, _ = forward_rows(model, rows)
    full = [token_logprobs(lg, ids, lens, rule) for lg, (ids, _, lens) in zip(logits, rows, strict=True)]
    sum((lp * (k + 1)).sum() + ent.sum() for k, (lp, ent) in enumerate(full)).backward()
    for (lp, ent), (full_lp, full_ent) in zip(chunked, full, strict=True):
        torch.testing.assert_close(lp, full_lp, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ent, full_ent, atol=1e-6, rtol=1e-6)
    for mine, theirs in zip(got, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    model.zero_grad()


@torch.no_grad()
def test_the_head_runs_only_on_positions_that_predict_a_token_of_their_segment(model, monkeypatch):
    """Padding and each segment's last token predict nothing that is scored: the head's products skip them
    (21 + 9 tokens in 4 + 1 segments: 25 rows, of the layout's 2 x 15 = 30 positions)."""
    from prime_rl.trainer import chunked_logprobs

    seen = []
    real = chunked_logprobs.token_stats
    monkeypatch.setattr(chunked_logprobs, "token_stats", lambda h, *a, **k: seen.append(h.shape[0]) or real(h, *a, **k))
    score_rows(model, rows_with_shared_prompt())
    assert seen == [25]


@pytest.mark.parametrize("chunked_head", [True, False])
def test_tokens_not_wanted_score_zero_and_the_others_and_their_gradients_do_not_change(model, monkeypatch,
                                                                                      chunked_head):
    """`wanted` (the trainer passes `MicroBatch.scored_tokens`: trained and completion tokens) leaves out the
    head's rows of the other tokens: they answer 0, every wanted token's (lp, H) and gradient is what scoring
    them all gives, on the chunked head and on the full logits alike."""
    from prime_rl.trainer import chunked_logprobs

    if not chunked_head:
        monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    rows = rows_with_shared_prompt()
    wanted = [torch.rand(ids.numel(), generator=torch.Generator().manual_seed(k)) < 0.5
              for k, (ids, _, _) in enumerate(rows)]

    def scored_and_grads(want):
        model.zero_grad()
        out, _ = score_rows(model, rows, SamplingRule(temperature=0.9), wanted=want)
        sum(((lp * (k + 2))[w].sum() + ent[w].sum()) for k, ((lp, ent), w) in enumerate(zip(out, wanted, strict=True))
            ).backward()
        return out, [p.grad.clone() for p in model.parameters()]

    seen = []
    real = chunked_logprobs.token_stats
    monkeypatch.setattr(chunked_logprobs, "token_stats", lambda h, *a, **k: seen.append(h.shape[0]) or real(h, *a, **k))
    some, some_grads = scored_and_grads(wanted)
    every, every_grads = scored_and_grads(None)
    for (lp, ent), (all_lp, all_ent), w in zip(some, every, wanted, strict=True):
        assert not lp[~w].any() and not ent[~w].any()
        torch.testing.assert_close(lp[w], all_lp[w], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ent[w], all_ent[w], atol=1e-6, rtol=1e-6)
    for mine, theirs in zip(some_grads, every_grads, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)
    if chunked_head:
        assert seen[0] < seen[1] == 25
    model.zero_grad()


def test_a_micro_batch_scores_its_trained_and_its_completion_tokens():
    from prime_rl.batch_format import MicroBatch

    mb = MicroBatch(input_ids=torch.arange(10), position_ids=torch.arange(10), sample_lens=torch.tensor([6, 4]),
                    loss_mask=torch.tensor([0, 0, 0, 1, 0, 1, 0, 0, 1, 1], dtype=torch.bool),
                    inference_logprobs=torch.zeros(10), advantages=torch.zeros(10), policy_step=torch.zeros(2))
    assert mb.scored_tokens.int().tolist() == [0, 0, 0, 1, 0, 1, 0, 0, 1, 1]
    mb.completion_lens = torch.tensor([3, 1])
    assert mb.scored_tokens.int().tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


@torch.no_grad()
def test_the_kept_positions_of_the_flash_layout_map_to_their_targets(model, monkeypatch):
    """flash_attention_2's layout computes only `keep`'s positions: the chunked head's targets follow them.
    (Run with sdpa and no mask here: both sides see the same forward, whatever it attends to.)"""
    monkeypatch.setattr(trainer_model, "_layout", lambda _model, rows, _pad: flash_layout(rows))
    rows = rows_with_shared_prompt()
    chunked, _ = score_rows(model, rows, SamplingRule(temperature=0.9))
    logits, _ = forward_rows(model, rows)
    for (lp, ent), lg, (ids, _, lens) in zip(chunked, logits, rows, strict=True):
        full_lp, full_ent = token_logprobs(lg, ids, lens, SamplingRule(temperature=0.9))
        torch.testing.assert_close(lp, full_lp, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ent, full_ent, atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_hidden_states_come_from_the_same_forward(model):
    (ids, pos, lens), _ = rows_with_shared_prompt()
    lp, ent, hidden = compute_logprobs_and_hidden(model, ids, pos, lens)
    (logits,), (full_hidden,) = forward_rows(model, [(ids, pos, lens)], hidden=True)
    torch.testing.assert_close(hidden, full_hidden)
    torch.testing.assert_close(lp, token_logprobs(logits, ids, lens)[0], atol=1e-6, rtol=1e-6)


def test_a_model_that_rescales_its_logits_is_scored_from_them(model, monkeypatch):
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    assert not head_output_is_logits(model)
    rows = rows_with_shared_prompt()
    with torch.no_grad():
        (lp, _), _ = score_rows(model, rows)[0]
        logits, _ = forward_rows(model, rows)
    torch.testing.assert_close(lp, token_logprobs(logits[0], *rows[0][::2])[0])


def test_a_token_past_the_sampled_vocabulary_is_refused_in_one_line(model):
    ids = torch.tensor([1, 2, 95, 3])
    with pytest.raises(UserError, match="token id 95 is past the sampled vocabulary"):
        score_rows(model, [(ids, torch.arange(4), torch.tensor([4]))], SamplingRule(vocab=90))


@pytest.mark.gpu
def test_on_cuda_in_bf16_a_long_row_matches_the_full_logits_in_a_fraction_of_the_memory(qwen3_tiny_model):
    """Qwen3's 151,936 output rows, one 4,096-token row, bf16 weights on the GPU: the chunked head's logprobs,
    entropies and gradients equal the full-logits computation's to bf16 rounding, at a fraction of its peak."""
    model = AutoModelForCausalLM.from_pretrained(qwen3_tiny_model, dtype=torch.bfloat16).cuda()
    ids = torch.randint(0, 151_669, (4096,), generator=torch.Generator().manual_seed(0))
    rows = [(ids, torch.arange(4096), torch.tensor([4096]))]
    rule = SamplingRule(temperature=0.9, vocab=151_669)

    def run(chunked: bool):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        if chunked:
            ((lp, ent),), _ = score_rows(model, rows, rule)
        else:
            logits, _ = forward_rows(model, trainer_model.on_model_device(model, rows))
            lp, ent = token_logprobs(logits[0], ids.cuda(), rows[0][2].cuda(), rule)
        (lp.sum() + 0.1 * ent.sum()).backward()
        grads = [p.grad.float().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return lp.detach(), ent.detach(), grads, torch.cuda.max_memory_allocated() - base

    lp, ent, grads, peak = run(True)
    full_lp, full_ent, full_grads, full_peak = run(False)
    torch.testing.assert_close(lp, full_lp, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(ent, full_ent, atol=2e-3, rtol=1e-3)
    for mine, theirs in zip(grads, full_grads, strict=True):
        cosine = torch.nn.functional.cosine_similarity(mine.flatten(), theirs.flatten(), dim=0)
        assert cosine > 0.999, cosine
    assert peak < full_peak / 4, (peak, full_peak)


@torch.no_grad()
def test_hidden_states_alone_are_those_of_the_full_forward(model):
    """The value head's V_old pass takes hidden states without logits (`forward_hidden`)."""
    from prime_rl.trainer.model import forward_hidden

    rows = rows_with_shared_prompt()
    for mine, theirs in zip(forward_hidden(model, rows), forward_rows(model, rows, hidden=True)[1], strict=True):
        torch.testing.assert_close(mine, theirs)

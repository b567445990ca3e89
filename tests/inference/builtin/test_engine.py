"""The builtin engine samples and scores over the tokenizer's ids only: a model whose padded embedding rows
carry most of the probability never yields one of them, and reports the logprobs the trainer computes."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.inference.builtin.engine import Engine, SamplingParams
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.models.tiny_model import save_random_model
from prime_rl.trainer.model import compute_logprobs

CHARS = 99  # the char tokenizer's ids
PADDED = 128  # the model's output rows


@pytest.fixture(scope="module")
def flat_padded_model(tmp_path_factory):
    """A tiny Qwen3 with 128 output rows for 99 token ids and an all-zero output embedding: every logit is 0,
    so 29 of 128 equally likely rows are padding."""
    path = save_random_model(tmp_path_factory.mktemp("padded"), hidden_size=32, num_layers=1, vocab_size=PADDED)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.get_output_embeddings().weight.zero_()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def engine(flat_padded_model):
    eng = Engine(str(flat_padded_model), context_len=64, seed=0, max_batch_size=16)
    yield eng
    eng.close()


def test_padded_rows_are_never_sampled_and_logprobs_are_over_the_tokenizers_ids(engine):
    assert engine.vocab == CHARS
    # Over all 128 rows, 16 x 24 draws would miss every padded id with probability (99/128)^384 < 1e-42.
    done = engine.submit([5, 6, 7], SamplingParams(max_tokens=24, temperature=1.0, seed=1), n=16).result(timeout=120)
    sampled = [t for c in done for t in c.token_ids]
    assert len(sampled) > 100 and max(sampled) < CHARS
    for c in done:
        assert c.logprobs == pytest.approx([-math.log(CHARS)] * len(c.token_ids), abs=1e-5)


def test_prompt_logprobs_are_over_the_tokenizers_ids_and_match_the_trainer(engine, flat_padded_model):
    prompt = [3, 98, 40, 41, 7, 7, 60]
    (done,) = engine.submit(prompt, SamplingParams(max_tokens=1, prompt_logprobs=True)).result(timeout=60)
    assert [lp for lp, _ in done.prompt_logprobs] == pytest.approx([-math.log(CHARS)] * 6, abs=1e-5)
    model = AutoModelForCausalLM.from_pretrained(flat_padded_model)
    ids = torch.tensor(prompt)
    lp, _ = compute_logprobs(model, ids, torch.arange(len(ids)), torch.tensor([len(ids)]), SamplingRule(vocab=CHARS))
    assert lp[1:].tolist() == pytest.approx([lp for lp, _ in done.prompt_logprobs], abs=1e-6)


def test_a_prompt_token_past_the_sampled_vocabulary_fails_its_request_alone(engine):
    bad = engine.submit([3, 100, 4], SamplingParams(max_tokens=2, prompt_logprobs=True))
    good = engine.submit([3, 4, 5], SamplingParams(max_tokens=2, prompt_logprobs=True))
    with pytest.raises(ValueError, match="past the vocabulary"):
        bad.result(timeout=60)
    assert len(good.result(timeout=60)[0].prompt_logprobs) == 2


def test_a_one_token_prompt_scores_to_no_logprobs_instead_of_failing(engine):
    """A prompt of one token has nothing after its first token to score (vLLM answers [None]); it was a 500."""
    (done,) = engine.submit([7], SamplingParams(max_tokens=2, prompt_logprobs=True)).result(timeout=60)
    assert done.prompt_logprobs == [] and len(done.token_ids) >= 1


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_long_prompts_are_scored_in_chunks_as_one_pass_would(tiny_model_dir, monkeypatch, temperature):
    """Prompt scoring makes logits a few rows at a time (`PROMPT_CHUNK_LOGITS`): same logprobs and ranks."""
    from prime_rl.inference.builtin import engine as engine_module

    prompt = [int(t) for t in torch.randint(0, CHARS, (40,), generator=torch.Generator().manual_seed(2))]
    params = SamplingParams(max_tokens=1, temperature=temperature, prompt_logprobs=True)
    results = []
    for chunk_logits in (10**9, CHARS * 3):  # one chunk, then chunks of 3 positions
        monkeypatch.setattr(engine_module, "PROMPT_CHUNK_LOGITS", chunk_logits)
        eng = Engine(str(tiny_model_dir), context_len=64, seed=0)
        try:
            results.append(eng.submit(prompt, params).result(timeout=60)[0].prompt_logprobs)
        finally:
            eng.close()
    assert [r for _, r in results[0]] == [r for _, r in results[1]]
    assert [lp for lp, _ in results[0]] == pytest.approx([lp for lp, _ in results[1]], abs=1e-6)

"""The builtin engine's grouped-query attention (`models/attention.py`) against transformers' own sdpa."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from prime_rl.inference.builtin.engine import load_model
from prime_rl.models import attention
from prime_rl.models.attention import GQA_SDPA, gqa_sdpa
from prime_rl.models.tiny_model import save_random_model


class Heads(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (16, 8), (32, 4), (4, 4)])
@pytest.mark.parametrize("q_len", [1, 7])
@pytest.mark.parametrize("additive", [False, True])
def test_grouped_attention_equals_transformers_sdpa_with_a_padding_mask(heads, kv_heads, q_len, additive):
    """Left padding and a causal part, bool or additive, decode (one query) and prefill: the same output."""
    torch.manual_seed(0)
    batch, keys, dim = 3, 12, 32
    query = torch.randn(batch, heads, q_len, dim)
    key, value = torch.randn(batch, kv_heads, keys, dim), torch.randn(batch, kv_heads, keys, dim)
    mask = torch.ones(batch, 1, q_len, keys, dtype=torch.bool).tril(keys - q_len)
    mask[0, :, :, :5] = False  # a left-padded row
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    module = Heads(heads // kv_heads)
    ours, _ = gqa_sdpa(module, query, key, value, mask, scaling=dim ** -0.5)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert ours.shape == (batch, q_len, heads, dim)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_without_a_mask_it_is_transformers_sdpa(monkeypatch):
    calls = []
    monkeypatch.setattr("transformers.integrations.sdpa_attention.sdpa_attention_forward",
                        lambda *args, **kwargs: calls.append(kwargs) or ("sdpa", None))
    query, key = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    assert gqa_sdpa(Heads(2), query, key, key, None)[0] == "sdpa" and len(calls) == 1


def test_the_engine_serves_a_grouped_qwen3_with_it_and_the_same_logits(tmp_path, monkeypatch):
    """The builtin engine's model runs the grouped attention (no K/V copy: `repeat_kv` is never called) and gives
    the logits transformers' sdpa gives, padded batch and all."""
    path = save_random_model(tmp_path / "m", num_heads=8, num_kv_heads=2, hidden_size=128, num_layers=2)
    ours = load_model(str(path), torch.float32, torch.device("cpu"))
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert ours.config._attn_implementation == GQA_SDPA and theirs.config._attn_implementation == "sdpa"
    ids = torch.randint(5, 90, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, :6] = 0
    copies = []
    monkeypatch.setattr("transformers.integrations.sdpa_attention.repeat_kv",
                        lambda *args: copies.append(1) or pytest.fail("the K/V cache was copied"))
    with torch.no_grad():
        got = ours(input_ids=ids, attention_mask=mask).logits
    monkeypatch.undo()
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    assert attention.register() == GQA_SDPA  # registering again is harmless

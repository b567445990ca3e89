"""Prefix reuse in the builtin engine (`kv_cache.PrefixStore`, `Engine._prefill_prompts`): a conversation's next
turn is prefilled only past what a finished sequence left, and computes what a full prefill computes; identical
prompts admitted together share one row; nothing computed under old weights is reused; the store stays within
its memory."""

from __future__ import annotations

import pytest
import torch

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.inference.builtin.engine import Engine, SamplingParams
from prime_rl.inference.builtin.kv_cache import PrefixStore

TURN = SamplingParams(max_tokens=12, temperature=1.0, seed=5)


def layers(length: int, value: float = 1.0, heads: int = 2, dim: int = 4) -> list:
    return [(torch.full((heads, length, dim), value), torch.full((heads, length, dim), -value)) for _ in range(2)]


def test_the_store_finds_the_longest_stored_prefix_and_leaves_a_token_to_run():
    store = PrefixStore(10**6)
    store.save([1, 2, 3], layers(3, 1.0))
    store.save([1, 2, 3, 4, 5], layers(5, 2.0))
    store.save([9, 9], layers(2, 3.0))
    used, kv = store.longest([1, 2, 3, 4, 5, 6, 7])
    assert used == 5 and kv[0][0].shape == (2, 5, 4) and float(kv[0][0][0, 0, 0]) == 2.0
    used, kv = store.longest([1, 2, 3, 4, 8])  # continues [1, 2, 3] only
    assert used == 3 and float(kv[1][1][0, 0, 0]) == -1.0
    assert store.longest([1, 2, 3, 4, 5])[0] == 4  # the same ids: all but the last token is reused
    assert store.longest([2, 3]) is None and store.longest([1]) is None
    assert (store.hits, store.saved_tokens) == (3, 12)


def test_the_store_keeps_to_its_memory_least_recently_used_out():
    entry = sum(k.numel() * 4 + v.numel() * 4 for k, v in layers(4))
    store = PrefixStore(2 * entry)
    store.save([1, 1, 1, 1], layers(4))
    store.save([2, 2, 2, 2], layers(4))
    assert store.longest([1, 1, 1, 1, 0]) is not None  # [1...] is now the most recently used
    store.save([3, 3, 3, 3], layers(4))  # evicts [2...]
    assert len(store) == 2 and store.bytes == 2 * entry
    assert store.longest([2, 2, 2, 2, 0]) is None and store.longest([1, 1, 1, 1, 0]) is not None
    store.save([4] * 12, layers(12))  # larger than the whole store: not kept, nothing evicted
    assert len(store) == 2
    off = PrefixStore(0)
    off.save([1, 2], layers(2))
    assert len(off) == 0 and off.longest([1, 2, 3]) is None


@pytest.fixture(scope="module")
def engines(qwen3_tiny_model):
    """The same tiny real-vocabulary Qwen3 twice (fp32): with a prefix store and without."""
    reuse = Engine(str(qwen3_tiny_model), context_len=512, max_batch_size=16, prefix_cache_mib=64)
    full = Engine(str(qwen3_tiny_model), context_len=512, max_batch_size=16, prefix_cache_mib=0)
    yield reuse, full
    reuse.close()
    full.close()


def conversation(engine: Engine, chat: ChatTokens, turns: int) -> list:
    """`turns` turns of one conversation token in, token out (as a multi-turn rollout or an agent session runs
    it): each prompt is the previous prompt, its sampled ids, and the template tail of a new user message."""
    history = [{"role": "user", "content": "Count to three."}]
    prompt = chat.prompt_ids(history, [])
    completions = []
    for turn in range(turns):
        (completion,) = engine.submit(prompt, TURN).result(timeout=60)
        completions.append(completion)
        history += [{"role": "assistant", "content": completion.text}]
        reply = [{"role": "user", "content": f"And then {turn}?"}]
        prompt = prompt + completion.token_ids + chat.reply_ids(history, reply, [], completion.token_ids[-1])
        history += reply
    return completions


@pytest.mark.slow
def test_each_turn_is_prefilled_past_the_conversation_so_far_and_samples_what_a_full_prefill_does(
        engines, qwen3_tiny_model):
    reuse, full = engines
    chat = ChatTokens.load(str(qwen3_tiny_model))
    reused, fresh = conversation(reuse, chat, 4), conversation(full, chat, 4)
    assert reuse.prefixes.hits == 3 and reuse.prefixes.saved_tokens > 0 and full.prefixes.hits == 0
    for a, b in zip(reused, fresh, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


@pytest.mark.slow
def test_identical_prompts_sent_together_sample_what_one_request_of_n_does(engines, qwen3_tiny_model):
    reuse, _ = engines
    prompt = ChatTokens.load(str(qwen3_tiny_model)).prompt_ids([{"role": "user", "content": "Name a color."}], [])
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=40 + i) for i in range(4)]
    with reuse._lock:  # submitted while the loop waits: admitted in one prefill
        futures = [reuse.submit(prompt, p) for p in params]
    apart = [f.result(timeout=60)[0] for f in futures]
    together = reuse.submit(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=40), n=4).result(timeout=60)
    assert [c.token_ids for c in apart] == [c.token_ids for c in together]


@pytest.mark.slow
def test_nothing_computed_under_old_weights_is_reused(engines, qwen3_tiny_model):
    reuse, _ = engines
    chat = ChatTokens.load(str(qwen3_tiny_model))
    conversation(reuse, chat, 1)
    assert len(reuse.prefixes)
    staged = reuse.stage_weights(str(qwen3_tiny_model))  # the same weights, as a new step
    reuse.apply_weights(staged, reuse.weight_step + 1)
    assert len(reuse.prefixes) == 0
    hits = reuse.prefixes.hits
    conversation(reuse, chat, 2)  # its first turn finds nothing; its second, the first's
    assert reuse.prefixes.hits == hits + 1
    reuse.reset()
    assert len(reuse.prefixes) == 0

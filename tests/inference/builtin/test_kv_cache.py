"""The running batch's KV cache (`kv_cache.BatchCache`): merged rows of different lengths keep their real tokens
and mask their padding, retired rows leave with the columns no one needs, and a row merged into a batch computes
what it computes alone."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from prime_rl.inference.builtin.kv_cache import BatchCache, left_padded, position_ids, row_caches, take_rows

LAYERS, HEADS, DIM = 2, 1, 3


def rows_cache(lengths: list[int], width: int, first: int) -> tuple[DynamicCache, torch.Tensor]:
    """A cache of rows with `lengths` real positions, left-padded to `width` (padding: key/value -1), and its mask.
    Real position j of row r holds first + 100 * r + j (keys) and its negative (values), in every layer."""
    cache = DynamicCache()
    keys = torch.full((len(lengths), HEADS, width, DIM), -1.0)
    for r, length in enumerate(lengths):
        real = first + 100 * r + torch.arange(length, dtype=torch.float32)
        keys[r, :, width - length:] = real[None, :, None]
    for layer in range(LAYERS):
        cache.update(keys.clone(), -keys.clone(), layer)
    _, mask = left_padded([[1] * length for length in lengths], width, pad_id=0)
    return cache, mask


def real_keys(batch: BatchCache, row: int, layer: int = 0) -> list[float]:
    """The keys of `row`'s real positions (first head and feature), in order."""
    return batch.cache.layers[layer].keys[row, 0, batch.mask[row].bool(), 0].tolist()


def test_merging_rows_of_different_lengths_keeps_real_tokens_and_masks_the_padding():
    batch = BatchCache()
    assert len(batch) == 0 and batch.width == 0
    batch.add(*rows_cache([3, 2], width=3, first=0))  # running: rows 0, 1
    batch.add(*rows_cache([5, 4], width=5, first=1000))  # newly prefilled, wider: the running rows get padded
    assert len(batch) == 4 and batch.width == 5
    # Every row ends at column 5; the padding the new rows brought stays masked.
    assert batch.mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert real_keys(batch, 0) == [0, 1, 2] and real_keys(batch, 1) == [100, 101]
    assert real_keys(batch, 2) == [1000, 1001, 1002, 1003, 1004] and real_keys(batch, 3) == [1100, 1101, 1102, 1103]
    for layer in batch.cache.layers:
        assert layer.keys.shape == layer.values.shape == (4, HEADS, 5, DIM)
        assert torch.equal(layer.values, -layer.keys)
    assert position_ids(batch.mask, 5).tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 0, 1], [0, 1, 2, 3, 4],
                                                     [0, 0, 1, 2, 3]]

    batch.add(*rows_cache([1], width=1, first=2000))  # narrower: only the new row is padded
    assert batch.width == 5 and batch.mask[4].tolist() == [0, 0, 0, 0, 1] and real_keys(batch, 4, 1) == [2000]
    assert real_keys(batch, 2, 1) == [1000, 1001, 1002, 1003, 1004]


def test_the_decode_column_is_real_in_every_row_and_counts_on_each_rows_positions():
    batch = BatchCache()
    batch.add(*rows_cache([2], width=2, first=0))
    batch.add(*rows_cache([4], width=4, first=100))
    mask = batch.extend()
    assert mask is batch.mask and batch.width == 5 and mask[:, -1].tolist() == [1, 1]
    assert position_ids(mask, 1).tolist() == [[2], [4]]  # the next position of each row's own tokens


def test_retire_moves_the_last_rows_into_the_freed_places_and_drops_the_columns_only_padding_needed():
    batch = BatchCache()
    batch.add(*rows_cache([2, 6, 4], width=6, first=0))
    assert batch.retire([1]) == [0, 2]  # the longest row leaves, the last row takes its place
    assert len(batch) == 2 and batch.width == 4  # two columns were padding in both rows left
    assert batch.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert real_keys(batch, 0) == [0, 1] and real_keys(batch, 1, 1) == [200, 201, 202, 203]
    assert batch.cache.layers[1].keys.shape[2] == 4 and batch.cache.layers[1].values.shape[:3] == (2, HEADS, 4)
    assert batch.retire([]) == [0, 1]  # nothing leaves: nothing changes
    assert batch.width == 4 and real_keys(batch, 0) == [0, 1]
    assert batch.retire([0, 1]) == []
    assert len(batch) == 0 and batch.width == 0 and batch.cache is None
    batch.add(*rows_cache([1], width=1, first=7))  # empty again: the next rows are the batch
    assert batch.mask.tolist() == [[1]] and real_keys(batch, 0) == [7]
    batch.reset()
    assert len(batch) == 0 and batch.mask is None


def test_retire_of_many_rows_keeps_every_row_left_with_its_own_data():
    """Rows leave from the middle, the end and the start at once; each row left is found at the place `retire`
    says, with its keys, values and mask; leaving rows past the end never move."""
    lengths = [3, 5, 2, 6, 4, 1, 5]
    batch = BatchCache()
    batch.add(*rows_cache(lengths, width=6, first=0))
    before = [(real_keys(batch, row), batch.mask[row].tolist()) for row in range(len(lengths))]
    order = batch.retire([0, 3, 5, 6])
    assert sorted(order) == [1, 2, 4] and len(batch) == 3
    assert batch.width == 5  # column 0 was padding in rows 1, 2 and 4
    for place, old in enumerate(order):
        assert real_keys(batch, place) == before[old][0]
        values = batch.cache.layers[1].values[place, 0, batch.mask[place].bool(), 0]
        assert [-x for x in values.tolist()] == before[old][0]
        assert batch.mask[place].tolist() == before[old][1][1:]


def test_take_rows_copies_rows():
    cache, _ = rows_cache([2, 3], width=3, first=0)
    take_rows(cache, torch.tensor([1, 1, 0]))  # a row may repeat: the n choices of one prompt
    assert cache.layers[0].keys[:, 0, :, 0].tolist() == [[100, 101, 102], [100, 101, 102], [-1, 0, 1]]


def test_left_padded_aligns_prompts_to_the_right():
    ids, mask = left_padded([[5, 6], [7, 8, 9], []], 3, pad_id=0)
    assert ids.tolist() == [[0, 5, 6], [7, 8, 9], [0, 0, 0]]
    assert mask.tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 0]]


@torch.inference_mode()
def test_a_row_merged_into_the_batch_computes_what_it_computes_alone(tiny_model_dir):
    """Two prompts prefilled apart, merged into one batch (the short one padded) and decoded one step together
    give the logits of each prompt and token run alone: the invariants hold on a real model's cache."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts, nxt = [[5, 6, 7, 8, 9, 10, 11], [12, 13]], [20, 21]

    def forward(ids, mask, cache):
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask, ids.shape[1]),
                    past_key_values=cache, use_cache=True)
        return out.logits[:, -1]

    batch = BatchCache()
    for prompt in prompts:
        ids, mask = left_padded([prompt], len(prompt), pad_id=0)
        cache = DynamicCache()
        forward(ids, mask, cache)
        batch.add(cache, mask)
    assert batch.width == len(prompts[0])
    logits = forward(torch.tensor(nxt)[:, None], batch.extend(), batch.cache)
    for row, (prompt, token) in enumerate(zip(prompts, nxt, strict=True)):
        alone = model(input_ids=torch.tensor([prompt + [token]])).logits[0, -1]
        assert torch.allclose(logits[row], alone, atol=1e-4), (logits[row] - alone).abs().max()
    assert batch.retire([0]) == [1]  # the long row retires: the short one goes on, its padding dropped
    assert batch.width == len(prompts[1]) + 1
    logits = forward(torch.tensor([[22]]), batch.extend(), batch.cache)
    alone = model(input_ids=torch.tensor([prompts[1] + [21, 22]])).logits[0, -1]
    assert torch.allclose(logits[0], alone, atol=1e-4)


@pytest.mark.parametrize("lengths", [[1], [4, 4]])
def test_equal_widths_merge_without_padding(lengths):
    batch = BatchCache()
    batch.add(*rows_cache(lengths, width=4, first=0))
    batch.add(*rows_cache([4], width=4, first=500))
    assert batch.width == 4 and real_keys(batch, len(lengths)) == [500, 501, 502, 503]


def test_row_caches_copy_each_rows_real_positions_holes_and_padding_left_out():
    """Rows copied out together (a retire step's finished rows): left padding, a row with a hole in the middle (a
    prefill on a stored prefix: prefix padding, prefix, rest padding, rest), rows picked out of order, a row with
    no real position; each part equals that row's own real positions, and changing the batch afterwards changes
    no part."""
    cache, mask = rows_cache([4, 2, 5, 0], width=6, first=10)
    mask[2, 3] = 0  # a hole: the row's real positions are columns 1, 2, 4, 5
    for layer in cache.layers:
        layer.keys[2, :, 3] = -1.0
    parts = row_caches(cache, mask, [2, 0, 3])
    assert len(parts) == 3 and all(len(part) == LAYERS for part in parts)
    for part, row in zip(parts, [2, 0, 3], strict=True):
        columns = mask[row].nonzero()[:, 0]
        for layer, (k, v) in zip(cache.layers, part, strict=True):
            assert k.shape == (HEADS, len(columns), DIM) and v.shape == k.shape
            assert torch.equal(k, layer.keys[row][:, columns]) and torch.equal(v, layer.values[row][:, columns])
    assert parts[0][0][0][0, :, 0].tolist() == [210.0, 211.0, 213.0, 214.0]
    for layer in cache.layers:
        layer.keys.zero_()
    assert parts[1][0][0][0, :, 0].tolist() == [10.0, 11.0, 12.0, 13.0]  # a copy, not a view of the batch

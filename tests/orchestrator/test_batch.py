"""Samples -> packed, rank-balanced micro-batches in the batch-file contract."""

from __future__ import annotations

import random

import pytest
import torch

from prime_rl.batch_format import read_rank, segment_roots, write_step
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.batch import Sample, assign_rows, make_units, micro_batch, pack_batch, unit_length
from prime_rl.utils.packing import first_fit_decreasing


def sample(prompt_len: int, completion_len: int, advantage: float = 0.5, step: int = 3, train: bool = True) -> Sample:
    return Sample(list(range(1, prompt_len + 1)), list(range(50, 50 + completion_len)),
                  [-0.1 * (i + 1) for i in range(completion_len)], advantage, step, train)


def test_micro_batch_fields():
    mb = micro_batch([[sample(3, 2, advantage=1.5, step=4)], [sample(2, 3, advantage=-1.0, step=5, train=False)]])
    mb.validate()
    assert mb.input_ids.tolist() == [1, 2, 3, 50, 51, 1, 2, 50, 51, 52]
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
    assert mb.sample_lens.tolist() == [5, 5] and mb.policy_step.tolist() == [4, 5]
    assert mb.loss_mask.tolist() == [False] * 3 + [True] * 2 + [False] * 5  # a masked sample trains nothing
    assert mb.inference_logprobs.tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, 0, 0, 0])  # 0 off-mask
    assert mb.advantages.tolist() == [0, 0, 0, 1.5, 1.5, 0, 0, 0, 0, 0]


def test_samples_of_one_prompt_share_it():
    a, b = sample(3, 2, advantage=1.5, step=4), sample(3, 3, advantage=-1.0, step=5)
    assert make_units([a, b, sample(4, 1)], seq_len=64) == [[a, b], [sample(4, 1)]]
    mb = micro_batch([[a, b]])
    mb.validate()
    # root = prompt[:-1]; each branch = [prompt[-1], completion], positions continuing the root's
    assert mb.input_ids.tolist() == [1, 2, 3, 50, 51, 3, 50, 51, 52]
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert mb.sample_lens.tolist() == [2, 3, 4] and mb.policy_step.tolist() == [4, 4, 5]
    assert mb.loss_mask.tolist() == [False, False, False, True, True, False, True, True, True]
    assert mb.advantages.tolist() == [0, 0, 0, 1.5, 1.5, 0, -1, -1, -1]
    assert mb.num_samples == 2  # the root trains nothing


def test_a_group_longer_than_seq_len_splits_into_units_that_fit():
    group = [sample(10, 6) for _ in range(8)]  # shared: 9 + 8 * 7 = 65 tokens
    units = make_units(group, seq_len=40)
    assert [len(u) for u in units] == [4, 4] and all(unit_length(u) <= 40 for u in units)
    assert make_units([sample(1, 3), sample(1, 3)], seq_len=64) == [[sample(1, 3)], [sample(1, 3)]]  # no root left


def test_without_share_prompts_every_sample_is_its_own_unit():
    group = [sample(10, 6) for _ in range(3)]
    assert make_units(group, seq_len=64, share_prompts=False) == [[s] for s in group]
    (batch,) = pack_batch(group, 64, 1, 0, SamplingRule(), 16, share_prompts=False)
    (mb,) = batch.micro_batches
    assert mb.sample_lens.tolist() == [16, 16, 16] and mb.position_ids.tolist() == list(range(16)) * 3


@pytest.mark.parametrize(("positions", "lens", "message"), [
    ([0, 1, 2, 2, 3], [3, 2], r"segment 1 starts at position 2 \(a branch\) but its root, segment 0, is 3 tokens"),
    ([1, 2], [2], r"segment 0 starts at position 1 \(a branch\) but no root \(position 0\) comes before it"),
    ([-1, 0], [2], "segment 0 starts at negative position -1"),
    ([0, 1, 3], [3], "segment 0: position ids are not consecutive"),
    ([0, 1, 2, 2], [2, 0, 2], r"segment 1 is empty"),
])
def test_layout_rule_is_validated(positions, lens, message):
    position_ids, sample_lens = torch.tensor(positions), torch.tensor(lens)
    with pytest.raises(ValueError, match=message):
        segment_roots(position_ids, sample_lens)


def test_a_micro_batch_without_tokens_is_invalid():
    mb = micro_batch([[sample(3, 2)]])
    empty = type(mb)(**{k: v[:0] if isinstance(v, torch.Tensor) else v for k, v in mb.to_dict().items()})
    with pytest.raises(ValueError, match="micro-batch has no tokens"):
        empty.validate()


def test_a_sample_longer_than_seq_len_is_named_as_a_unit():
    with pytest.raises(ValueError, match=r"unit \(a sample, or samples sharing a prompt\) 0 has 40 tokens, more than "
                                         "seq_len 32"):
        pack_batch([sample(30, 10)], 32, 1, 0, SamplingRule(), 16)


def test_first_fit_decreasing_respects_capacity_and_keeps_every_item():
    rng = random.Random(0)
    lengths = [rng.randint(5, 60) for _ in range(100)]
    rows = first_fit_decreasing(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(100))
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert len(rows) <= -(-sum(lengths) // 128) + 2  # first-fit decreasing is near the lower bound
    with pytest.raises(ValueError, match="more than seq_len"):
        first_fit_decreasing([10, 200], 128)


def test_assign_rows_equal_counts_and_balanced_tokens():
    tokens = [100, 90, 80, 70, 60, 50, 40, 30]
    ranks = assign_rows(tokens, 2)
    assert [len(r) for r in ranks] == [4, 4]
    totals = [sum(tokens[i] for i in r) for r in ranks]
    assert abs(totals[0] - totals[1]) <= 20
    assert [len(r) for r in assign_rows([5, 5, 5], 4)] == [1, 1, 1, 0]


RULE = SamplingRule(0.8, top_k=5, top_p=0.9, min_p=0.1)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_pack_batch_writes_equal_micro_batch_counts(tmp_path, world_size):
    rng = random.Random(world_size)
    samples = [sample(rng.randint(5, 20), rng.randint(1, 30)) for _ in range(17)]
    batches = pack_batch(samples, seq_len=64, world_size=world_size, step=7, rule=RULE, max_tokens=30)
    assert len({len(b.micro_batches) for b in batches}) == 1
    write_step(tmp_path, 7, batches)
    loaded = [read_rank(tmp_path, 7, r) for r in range(world_size)]
    seen_tokens = seen_samples = 0
    for batch in loaded:
        assert (batch.step, batch.rule, batch.max_tokens) == (7, RULE, 30)
        for mb in batch.micro_batches:
            assert mb.num_tokens <= 64
            starts = torch.cumsum(mb.sample_lens, 0) - mb.sample_lens
            assert not mb.loss_mask[starts].any()  # nothing predicts a segment's first token
            seen_tokens += mb.num_loss_tokens
            seen_samples += mb.num_samples
    assert seen_tokens == sum(len(s.completion_ids) for s in samples)
    assert seen_samples == len(samples)
    totals = [sum(mb.num_tokens for mb in b.micro_batches) for b in loaded]
    assert max(totals) - min(totals) <= 64  # balanced to within one row


def test_empty_batch_still_gives_every_rank_a_padding_row():
    batches = pack_batch([], seq_len=64, world_size=2, step=0, rule=SamplingRule(), max_tokens=8)
    assert [len(b.micro_batches) for b in batches] == [1, 1]
    assert all(mb.num_loss_tokens == 0 for b in batches for mb in b.micro_batches)


def test_truncate_to_seq_len_keeps_the_prompt():
    s = sample(10, 30).truncate(25)
    assert len(s) == 25 and len(s.prompt_ids) == 10 and len(s.completion_logprobs) == 15
    with pytest.raises(ValueError, match="does not fit"):
        sample(30, 5).truncate(25)

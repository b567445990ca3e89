"""The trainer's record of the samples a step's samples.jsonl holds (`trainer/rl/token_outcomes.py`): each recorded
sample's completion tokens, found by its key in packed rows with shared prompts, a cut sample, environment tokens
and padding, with the loss's outcome of each token (`losses.TOKEN_OUTCOMES`) at ratios on, past and beyond the
default loss's bounds."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path

import pytest
import torch

from prime_rl.batch_format import RECORD_FIELDS
from prime_rl.orchestrator.batch import Sample, micro_batch, padding_micro_batch
from prime_rl.run_dir import rollout_dir, token_outcomes_file
from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale
from prime_rl.trainer.rl.token_outcomes import micro_batch_outcomes, write_outcomes


def sample(prompt: list[int], completion: list[int], key: int, mask: list[bool] | None = None) -> Sample:
    return Sample(prompt, completion, [-1.0] * len(completion), 1.0, 0, completion_mask=mask, key=key)


def outcomes_of(mb, trainer_logprobs: torch.Tensor) -> list[dict]:
    inputs = LossInputs(trainer_logprobs, mb.inference_logprobs, mb.advantages, mb.loss_mask, mb.sample_lens)
    out = build_loss({"type": "default"})(inputs, LossScale.from_counts([100, 10, 1], 16), outcomes=True)
    return micro_batch_outcomes(mb, trainer_logprobs, out.outcomes)


def test_each_recorded_sample_gets_its_completion_tokens_whatever_the_packing():
    shared = [sample([1, 2, 3], [10, 11], key=0), sample([1, 2, 3], [12, 13, 14], key=1)]
    alone = sample([5, 6], [20, 21, 22, 23], key=4, mask=[True, False, False, True])  # environment tokens inside
    cut = sample([7], [30, 31, 32, 33, 34, 35], key=2).truncate(4)
    unrecorded = sample([8, 9], [40, 41], key=-1)
    mb = micro_batch([shared, [alone], [cut], [unrecorded]], RECORD_FIELDS)
    mb.validate()
    lp = torch.arange(mb.num_tokens, dtype=torch.float32) / -100  # each position its own value
    records = {r["key"]: r for r in outcomes_of(mb, lp)}
    assert sorted(records) == [0, 1, 2, 4]
    flat = mb.input_ids.tolist()

    def tokens_at(record):  # the ids at the positions whose logprobs the record holds
        return [flat[round(-x * 100)] for x in record["logprobs"]]

    assert tokens_at(records[0]) == [10, 11] and tokens_at(records[1]) == [12, 13, 14]
    assert records[4]["advantages"] == [1.0, 0.0, 0.0, 1.0]  # what each token trains with: 0 off the loss mask
    assert tokens_at(records[4]) == [20, 21, 22, 23] and records[4]["outcomes"][1:3] == "--"
    assert tokens_at(records[2]) == [30, 31, 32]  # cut to the row: seq_len 4 leaves 3 of its 6 tokens
    assert padding_micro_batch(RECORD_FIELDS).sample_keys.tolist() == [-1]


def test_outcomes_name_the_bound_each_token_met():
    s = sample([1, 2], [10, 11, 12, 13, 14, 15], key=7)
    mb = micro_batch([[s]], RECORD_FIELDS)
    lq = -1.0
    # log r per completion token: on the low bound (kept), below it, above the high bound, -inf, exactly 0, 30
    lp = torch.tensor([0.0, 0.0, lq + math.log(0.125), lq - 5, lq + 5, -math.inf, lq, lq + 30])
    (record,) = outcomes_of(mb, lp)
    default = build_loss({"type": "default"}).config
    assert (default.token_mask_low, default.token_mask_high) == (0.125, 8.0)
    # the ratio of 30 exceeds sequence_mask_high: the whole sample is masked high, so no token reads "k"
    assert record["outcomes"] == "hlhxhh"
    assert record["logprobs"][3] is None and json.loads(json.dumps(record)) == record  # valid JSON: no -Infinity
    mild = micro_batch([[sample([1, 2], [10, 11, 12], key=3)]], RECORD_FIELDS)
    (record,) = outcomes_of(mild, torch.tensor([0.0, 0.0, lq + math.log(0.125), lq - 5, lq]))
    assert record["outcomes"] == "lll"  # a token below the bound masks its sample low (the geometric mean too)
    (record,) = outcomes_of(mild, torch.tensor([0.0, 0.0, lq + math.log(0.125), lq, lq]))
    assert record["outcomes"] == "kkk"  # on the bound: kept


def test_a_full_disk_leaves_no_partial_record_file(tmp_path, monkeypatch):
    records = [{"key": 1, "logprobs": [-0.5], "outcomes": "k"}, {"key": 0, "logprobs": [-0.1], "outcomes": "l"}]
    write_outcomes(tmp_path, 3, 0, records)
    path = token_outcomes_file(rollout_dir(tmp_path, 3), 0)
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == [0, 1]
    before = path.read_bytes()

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space left"):
        write_outcomes(tmp_path, 3, 0, records[:1])
    assert path.read_bytes() == before and [p.name for p in path.parent.iterdir()] == [path.name]

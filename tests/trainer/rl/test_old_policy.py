"""The old policy lo of the surrogate: which source, and when a forward is spent (`trainer/rl/old_policy.py`)."""

from __future__ import annotations

import pytest
import torch

from prime_rl.trainer.rl import old_policy
from prime_rl.trainer.rl.old_policy import OldPolicy


class Batch:
    micro_batches = [object(), object()]


@pytest.fixture
def forwards(monkeypatch):
    calls = []

    def score_rows(model, rows, rule, entropies, wanted):
        calls.append(entropies)
        return [(torch.full((3,), -float(len(calls))), None)], None

    monkeypatch.setattr(old_policy, "score_rows", score_rows)
    monkeypatch.setattr(Batch, "micro_batches", [_mb(), _mb()])
    return calls


def _mb():
    class MB:
        input_ids = position_ids = torch.zeros(3, dtype=torch.long)
        sample_lens = torch.tensor([3])
        scored_tokens = torch.ones(3, dtype=torch.bool)
    return MB()


@pytest.mark.parametrize("epochs", [1, 3])
def test_a_loss_that_reads_no_old_policy_gets_none_and_costs_no_forward(forwards, epochs):
    old = OldPolicy(wanted=False, update_epochs=epochs)
    old.before_step(None, Batch(), None)
    assert old.known(0) is None and old.of(0, torch.zeros(3, requires_grad=True)) is None
    assert forwards == []


def test_with_one_epoch_lo_is_the_pass_own_logprobs_detached_and_no_forward_runs(forwards):
    old = OldPolicy(wanted=True, update_epochs=1)
    old.before_step(None, Batch(), None)
    lp = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    lo = old.of(1, lp)
    assert torch.equal(lo, lp.detach()) and not lo.requires_grad and old.known(1) is None
    assert forwards == []


def test_with_several_epochs_one_forward_per_micro_batch_before_the_step_serves_every_pass(forwards):
    old = OldPolicy(wanted=True, update_epochs=3)
    old.before_step(None, Batch(), None)
    assert forwards == [False, False]  # no entropies
    first, second = old.of(0, torch.zeros(3)), old.of(1, torch.zeros(3))
    assert torch.equal(first, torch.full((3,), -1.0)) and torch.equal(second, torch.full((3,), -2.0))
    assert old.known(0) is first and old.of(0, torch.ones(3)) is first  # the later passes read the same lo
    old.before_step(None, Batch(), None)  # the next step runs its own
    assert torch.equal(old.of(0, torch.zeros(3)), torch.full((3,), -3.0))

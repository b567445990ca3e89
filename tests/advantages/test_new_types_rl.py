"""Adding an advantage type is one function and one registration, wherever it is computed: a type defined here,
in the orchestrator (from each group's rewards) or in the trainer (per token, from the batch's rewards), trains an
in-process `rl` run end to end, and the batch the trainer trains on carries exactly that function's values."""

from __future__ import annotations

from typing import ClassVar, Literal

import pytest
import torch
from pydantic import ValidationError
from torch import Tensor

from prime_rl.advantages.token import TokenRow
from prime_rl.batch_format import RankBatch, read_rank
from prime_rl.configs.advantage import AdvantageBase, ComputedIn
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.rl import train as train_module
from tests.support.registered_advantage import registered_advantage
from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]


class MinBaselineConfig(AdvantageBase):
    """A_gi = r_gi - min_j r_gj: each rollout's reward above its group's worst (computed in the orchestrator)."""

    type: Literal["min_baseline"] = "min_baseline"


def min_baseline(rewards: Tensor) -> Tensor:
    advantages = rewards - rewards.amin(dim=1, keepdim=True)
    SEEN.append(advantages)  # for the test: what the orchestrator computed
    return advantages


class SampleRewardConfig(AdvantageBase):
    """A_t = R, the sample's reward, on every trained token of the sample (computed in the trainer)."""

    type: Literal["sample_reward"] = "sample_reward"
    computed_in: ClassVar[ComputedIn] = "trainer"


def sample_reward(row: TokenRow) -> Tensor:
    per_sample = torch.segment_reduce(row.rewards, "sum", lengths=row.sample_lens)
    return torch.repeat_interleave(per_sample, row.sample_lens) * row.mask


SEEN: list[Tensor] = []


@pytest.fixture
def trained(monkeypatch) -> list[RankBatch]:
    """The batches the trainer's update epochs train on, after the trainer's own advantage step."""
    batches = []
    train_on_batch = train_module.train_on_batch

    def recording(session, loss_fn, batch, *args, **kwargs):
        batches.append(batch)
        return train_on_batch(session, loss_fn, batch, *args, **kwargs)

    monkeypatch.setattr(train_module, "train_on_batch", recording)
    return batches


def test_a_group_type_defined_in_a_test_trains_on_its_own_advantages(tmp_path, trained):
    SEEN.clear()
    with registered_advantage(MinBaselineConfig, min_baseline):
        run = on_policy_run(tmp_path, '[orchestrator.advantage]\ntype = "min_baseline"\n', seq_len=256, max_tokens=8)
    computed = {float(a) for advantages in SEEN for a in advantages.float().flatten()}
    assert len(trained) == 3 and max(computed) > 0
    for batch in trained:
        values = {float(a) for mb in batch.micro_batches for a in mb.advantages[mb.loss_mask]}
        assert values and values <= computed, (batch.step, values - computed)  # >= 0: no built-in type's values
        assert batch.advantage == "min_baseline"
    assert all(row["advantage/mean"] > 0 for row in run.rows("orchestrator").values())
    with pytest.raises(ValidationError):  # unregistered again: the configs refuse the name
        OrchestratorConfig.build(overrides={"advantage": {"type": "min_baseline"}})


def test_a_type_computed_in_the_trainer_defined_in_a_test_trains_on_its_own_advantages(tmp_path, trained):
    with registered_advantage(SampleRewardConfig, sample_reward):
        run = on_policy_run(tmp_path, '[orchestrator.advantage]\ntype = "sample_reward"\n', seq_len=256,
                            max_tokens=8)
    assert len(trained) == 3
    for batch in trained:
        written = read_rank(run.run_dir, batch.step, 0)  # what the orchestrator sent: rewards, advantages of 0
        assert written.advantage == "sample_reward"
        for mb, ours in zip(written.micro_batches, batch.micro_batches, strict=True):
            assert not mb.advantages.any() and mb.rewards is not None
            row = TokenRow(mb.rewards.double() * mb.loss_mask, torch.zeros(mb.num_tokens, dtype=torch.float64),
                           mb.loss_mask, mb.sample_lens)
            assert torch.equal(ours.advantages, sample_reward(row).float())
        assert any(mb.advantages.any() for mb in batch.micro_batches)
    assert all(row["advantage/std"] == 0 for row in run.rows("orchestrator").values())
    assert all(row["optim/grad_norm"] > 0 for row in run.rows("trainer").values())

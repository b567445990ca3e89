"""The trainer's loss step (`step_scale` + `train_on_batch`) on a tiny model: the update does not
depend on how the step's samples are split into micro-batches or ranks for is_reshape (its sigma2 is a
statistic of the whole step, from a no-grad pre-pass all-reduced over ranks), nor on padding micro-batches
for token_local."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from prime_rl.batch_format import MicroBatch, RankBatch
from prime_rl.orchestrator.batch import padding_micro_batch
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.train import step_scale, train_on_batch
from tests.support.synthetic_batches import random_micro_batch
from tests.support.two_ranks import gloo_rank

VOCAB = 99  # the char tokenizer of tiny_model_dir


RESHAPE = {"type": "is_reshape", "rho_min": 0.9}  # rho_min = 0.9 makes gamma_base < 1, so sigma2 matters


def make_session(model_dir) -> SimpleNamespace:
    """What `train_on_batch` uses of a TrainSession: the model, backward, the device, the critic (none; no FSDP:
    each rank's gradient is its micro-batches' share of the global step gradient)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    return SimpleNamespace(model=model, backward=lambda loss: loss.backward(),
                           dist=SimpleNamespace(device=torch.device("cpu")), critic=None,
                           sampled_vocab=None)  # fmt: skip


@pytest.fixture(scope="module")
def session(tiny_model_dir):
    init_distributed()
    return make_session(tiny_model_dir)


def micro_batches(count: int = 3) -> list[MicroBatch]:
    g = torch.Generator().manual_seed(0)
    return [random_micro_batch(g, VOCAB, samples=2, prompt_len=3, completion_len=6) for _ in range(count)]


def concat(mbs: list[MicroBatch]) -> MicroBatch:
    """The same samples packed into one row."""
    names = ("input_ids", "position_ids", "sample_lens", "loss_mask", "inference_logprobs", "advantages", "policy_step")
    return MicroBatch(**{name: torch.cat([getattr(mb, name) for mb in mbs]) for name in names})


def run(session, loss_cfg: dict, mbs: list[MicroBatch]) -> tuple[float, dict[str, float], list[torch.Tensor]]:
    session.model.zero_grad(set_to_none=True)
    batch = RankBatch(step=0, temperature=1.0, max_tokens=6, micro_batches=mbs)
    total, metrics = train_on_batch(session, build_loss(loss_cfg), batch, step_scale(batch, torch.device("cpu")))
    return total, metrics, [p.grad.clone() for p in session.model.parameters() if p.grad is not None]


def assert_same_update(a, b, rtol):
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = a, b
    assert loss_a == pytest.approx(loss_b, rel=rtol, abs=1e-7)
    assert metrics_a == pytest.approx(metrics_b, rel=rtol, abs=1e-7)
    assert len(grads_a) == len(grads_b) > 0
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=rtol, atol=1e-7)


def test_is_reshape_update_does_not_depend_on_the_micro_batch_split(session):
    # One row vs three rows of the same samples (packed logprobs equal separate ones to ~1e-6, so
    # only a per-micro-batch sigma2 could differ).
    mbs = micro_batches()
    split = run(session, RESHAPE, mbs)
    whole = run(session, RESHAPE, [concat(mbs)])
    assert split[1]["loss/gamma_base"] < 1
    assert_same_update(split, whole, rtol=1e-4)


@pytest.mark.parametrize("loss_type", ["bnpo", "grpo"])
def test_token_local_update_does_not_change_with_padding_micro_batches(session, loss_type):
    # The orchestrator pads ranks with all-masked rows; with 2 ranks a step of 3 rows gets one.
    cfg = {"type": loss_type, "normalization": "token_local"}
    mbs = micro_batches()
    assert_same_update(run(session, cfg, mbs), run(session, cfg, [*mbs, padding_micro_batch()]), rtol=1e-6)


def test_step_scale_counts_only_micro_batches_with_a_trained_token():
    mbs = micro_batches()
    batch = RankBatch(step=0, temperature=1.0, max_tokens=6, micro_batches=[*mbs, padding_micro_batch()])
    init_distributed()
    assert step_scale(batch, torch.device("cpu")).num_micro_batches == 3


def _two_rank_worker(rank: int, store_path: str, model_dir: str, out_dir: str) -> None:
    with gloo_rank(rank, store_path):
        total, metrics, grads = run(make_session(model_dir), RESHAPE, micro_batches(4)[rank::2])
        torch.save({"total": total, "metrics": metrics, "grads": grads}, f"{out_dir}/rank_{rank}.pt")


@pytest.mark.slow
def test_is_reshape_update_is_the_same_on_two_ranks(session, tiny_model_dir, tmp_path):
    # Two gloo ranks with two micro-batches each: the moments are all-reduced, so the sum of the
    # ranks' gradients and the (all-reduced) metrics equal one process training all four.
    one = run(session, RESHAPE, micro_batches(4))
    mp.start_processes(_two_rank_worker, args=(str(tmp_path / "store"), str(tiny_model_dir), str(tmp_path)),
                       nprocs=2, start_method="spawn")  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank_{r}.pt") for r in range(2)]
    summed_grads = [a + b for a, b in zip(ranks[0]["grads"], ranks[1]["grads"], strict=True)]
    two = (ranks[0]["total"], ranks[0]["metrics"], summed_grads)
    assert ranks[1]["metrics"] == ranks[0]["metrics"]
    assert_same_update(one, two, rtol=1e-4)

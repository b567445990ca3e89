"""examples/is_reshape_study/analyze.py: its KL estimate (k3 of d = lp - lq over trained tokens)."""

import importlib.util
import math

import pytest
import torch

from prime_rl.trainer.rl.loss import compute_step_loss
from prime_rl.trainer.rl.losses import LossInputs
from tests.support import REPO

_PATH = REPO / "examples" / "is_reshape_study" / "analyze.py"
_spec = importlib.util.spec_from_file_location("is_reshape_study_analyze", _PATH)
analyze = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(analyze)


def test_k3_kl_hand_computed():
    # d = lp - lq on the trained tokens: 0, +0.5, -0.5; the 4th token is off the mask, the 5th has lq = -inf.
    lp = torch.tensor([-1.0, -0.5, -2.0, -9.0, -1.0])
    lq = torch.tensor([-1.0, -1.0, -1.5, 0.0, -math.inf])
    mask = torch.tensor([True, True, True, False, True])
    expected = (0.0 + (math.exp(0.5) - 1.5) + (math.exp(-0.5) - 0.5)) / 3  # 0.0850841...
    assert analyze.k3_kl(lp, lq, mask) == pytest.approx(expected, rel=1e-12)
    assert analyze.k3_kl(lp, lp, mask) == 0.0


def test_k3_kl_clamps_like_the_loss():
    lp, lq, mask = torch.tensor([0.0]), torch.tensor([-30.0]), torch.tensor([True])  # d = 30 -> 20
    assert analyze.k3_kl(lp, lq, mask) == pytest.approx(math.exp(20) - 21, rel=1e-12)


def test_k3_kl_is_the_trainers_mismatch_kl():
    gen = torch.Generator().manual_seed(0)
    lq = -torch.rand(64, generator=gen) * 3
    lp = lq + torch.randn(64, generator=gen)
    mask = torch.rand(64, generator=gen) > 0.3
    inputs = LossInputs(trainer_logprobs=lp, inference_logprobs=lq, advantages=torch.zeros(64), loss_mask=mask,
                        sample_lens=torch.tensor([64]))
    logged = compute_step_loss({"type": "vanilla"}, [inputs], max_tokens=64).metrics["loss/mismatch_kl"]
    assert analyze.k3_kl(lp, lq, mask) == pytest.approx(float(logged), rel=1e-5)

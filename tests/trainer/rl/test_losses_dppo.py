"""`dppo` is upstream prime-rl's default objective as its code computes it (PrimeIntellect-ai/prime-rl,
`src/prime_rl/trainer/rl/loss.py` `default_loss_fn`, last changed in e48a538; read at 559b447): the same loss,
gradient and masks on fixed tensors, at the edges (advantages of 0, a probability difference on the bound, large
ratios, untrained tokens)."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.losses import LossInputs, reduce_metrics
from tests.trainer.rl.test_losses import SUM


def upstream(lp, lq, adv, mask, mask_low=0.2, mask_high=0.2, adv_tau=1.0, kl_tau=1e-3):
    """The upstream loss's per-token arithmetic, transcribed: the sum over one packed micro-batch (upstream divides
    by the step's loss-token count outside the function, as `normalization = "token"` does here)."""
    log_r = lp - lq
    ratio = torch.exp(log_r)
    diff = torch.exp(lp) - torch.exp(lq)
    high, low = diff > mask_high, diff < -mask_low
    masked = torch.where(adv > 0, high, low)
    keep = mask & ~masked
    per_token = -(keep * (adv_tau * adv) * ratio) + kl_tau * (mask * log_r**2)
    return per_token.sum(), {"high": (adv > 0) & high & mask, "low": (adv < 0) & low & mask}


CASES = {
    # lp, lq, adv; every token trained unless the mask says otherwise
    "mixed": ([-0.1, -2.0, -0.3, -1.5, -0.05, -3.0], [-0.9, -1.0, -0.2, -0.4, -0.06, -2.9],
              [1.0, -1.0, 0.5, -0.5, 0.0, 2.0], None),
    "on_the_bound": ([math.log(0.7), math.log(0.3), math.log(0.7)], [math.log(0.5), math.log(0.5), math.log(0.5)],
                     [1.0, -1.0, 0.0], None),
    "zero_advantages": ([-0.2, -3.0, -0.01], [-1.9, -0.1, -0.02], [0.0, 0.0, 0.0], None),
    "untrained": ([-0.2, -3.0, -0.01, -0.5], [-1.9, -0.1, -0.02, -0.4], [1.0, -1.0, 1.0, 1.0],
                  [True, False, True, False]),
    "large_ratios": ([0.0, -12.0, -1e-6, -8.0], [-12.0, 0.0, -8.0, -1e-6], [1.0, -1.0, -2.0, 3.0], None),
}


@pytest.mark.parametrize("settings", [{}, {"mask_low": 0.05, "mask_high": 0.5, "adv_tau": 0.5, "kl_tau": 0.1}])
@pytest.mark.parametrize("case", CASES)
def test_dppo_is_upstream_prime_rls_default_loss(case, settings):
    lp, lq, adv, mask = CASES[case]
    mask = torch.tensor(mask if mask is not None else [True] * len(lp))
    ours_lp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    theirs_lp = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    lq_t, adv_t = torch.tensor(lq, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)
    inputs = LossInputs(ours_lp, lq_t, adv_t, mask, torch.tensor([len(lp)]))
    out = build_loss({"type": "dppo", "normalization": "token", **settings})(inputs, SUM)
    expected, flags = upstream(theirs_lp, lq_t, adv_t, mask, **settings)
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-15)
    (ours,) = torch.autograd.grad(out.loss, ours_lp)
    (theirs,) = torch.autograd.grad(expected, theirs_lp)
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-15)
    metrics = reduce_metrics([out.metrics])
    trained = int(mask.sum())
    assert metrics["loss/clip_frac_high"] == pytest.approx(int(flags["high"].sum()) / trained)
    assert metrics["loss/clip_frac_low"] == pytest.approx(int(flags["low"].sum()) / trained)


def test_dppo_bounds_are_refused_below_zero():
    with pytest.raises(Exception, match="mask_low"):
        build_loss({"type": "dppo", "mask_low": -0.1})

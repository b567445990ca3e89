"""Regression tests of the loss library at its edges (each failed on the code before its fix): overflowing and
infinite ratios, bounded and finite metrics, per-token OPSM, `bnpo` = TRL's sum(l) / sum(T) over the step,
`token_local` ignores padding micro-batches, `loss/teacher_kl`. The step statistics of `is_reshape`: test_losses.py's
split test and test_loss_trainer_step.py."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.configs.loss import LOSSES
from prime_rl.trainer.rl.loss import build_loss, compute_step_loss
from prime_rl.trainer.rl.losses import LOG_RATIO_BOUND, LossInputs, LossScale, kl_estimate, reduce_metrics

VARIANTS = [name for name in LOSSES.names if name != "custom"]  # every built-in, as registered
INF = math.inf


def batch(lp, lq, adv, lens, mask=None, dtype=torch.float32, **extra) -> LossInputs:
    mask = torch.ones(len(lp), dtype=torch.bool) if mask is None else torch.tensor(mask)
    extra = {k: torch.tensor(v, dtype=dtype) for k, v in extra.items()}
    return LossInputs(torch.tensor(lp, dtype=dtype, requires_grad=True), torch.tensor(lq, dtype=dtype),
                      torch.tensor(adv, dtype=dtype), mask, torch.tensor(lens), **extra)  # fmt: skip


def step(cfg: dict, mbs: list[LossInputs], max_tokens: int = 4):
    """Step loss, gradient per micro-batch and step metrics; asserts everything is finite."""
    out = compute_step_loss(cfg, mbs, max_tokens=max_tokens)
    grads = torch.autograd.grad(out.loss, [m.trainer_logprobs for m in mbs], allow_unused=True)
    grads = [torch.zeros_like(m.trainer_logprobs) if g is None else g for g, m in zip(grads, mbs, strict=True)]
    assert torch.isfinite(out.loss), cfg
    assert all(torch.isfinite(g).all() for g in grads), (cfg, grads)
    metrics = {k: v.item() for k, v in out.metrics.items()}
    assert all(math.isfinite(v) for v in metrics.values()), (cfg, metrics)
    return out.loss.item(), grads, metrics


# ---------------------------------------------------------------------------------------------
# Item 9: log r beyond float32's exp range, and infinite logprobs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("log_r", [88.0, 89.0, 1e4, INF, -88.0, -89.0, -1e4, -INF])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_extreme_log_ratio_gives_finite_loss_and_zero_gradient(variant, log_r, adv):
    # A normal two-token sample and a one-token sample whose log r = lp - lq is extreme.
    # log r > 0: lp = 0, lq = -log r (lq = -inf: the sampler gave the token probability 0);
    # log r < 0: lp = log r, lq = 0 (lp = -inf: the trainer gives it probability 0).
    lp, lq = (0.0, -log_r) if log_r > 0 else (log_r, 0.0)
    inputs = batch([-1.0, -0.7, lp], [-1.1, -0.6, lq], [0.5, 0.5, adv], [2, 1],
                   ref_logprobs=[-1.0, -0.8, -0.5], teacher_logprobs=[-0.9, -0.7, -0.4])  # fmt: skip
    inputs.entropies = torch.ones(3)
    for extra in ({}, {"kl_coef": 0.1, "kl_type": "k3"}):  # k3 on d = lp - ref = -88.5 ... must not overflow
        _, (grad,), metrics = step({"type": variant, **extra}, [inputs])
        extreme = grad[2].item()
        if not math.isfinite(log_r):
            assert extreme == 0.0  # dropped: no loss term at all, not even the KL
        elif extra:
            pass  # the KL's own gradient; finite (checked by `step`)
        elif variant == "cispo":
            # CISPO keeps every token's gradient -sg(clip(r)) A grad lp; r is clamped to e^(+-20) first.
            weight = 6.0 if log_r > 0 else math.exp(-LOG_RATIO_BOUND)
            assert extreme == pytest.approx(-weight * adv / 3)
        elif variant == "gspo_token":
            # The per-token path sg(s_i) exp(lp - sg(lp)) has gradient -s_i A unless clipped, with s_i
            # of the clamped log r (a one-token sample: s_i = e^(+-20)); sequence normalization, N = 2.
            s_i = math.exp(math.copysign(LOG_RATIO_BOUND, log_r))
            clipped = (adv > 0 and log_r > 0) or (adv < 0 and log_r < 0)
            assert extreme == (0.0 if clipped else pytest.approx(-s_i * adv / 2))
        else:
            assert extreme == 0.0  # clipped, masked or clamped: exactly 0, not 0 * inf = NaN
        if math.isfinite(log_r):
            assert metrics["loss/ratio_clamped_frac"] == pytest.approx(1 / 3)
            assert metrics.get("loss/nonfinite_ratio_frac", 0) == 0
        else:
            assert metrics["loss/nonfinite_ratio_frac"] == pytest.approx(1 / 3)
            assert metrics["loss/ratio_clamped_frac"] == 0


@pytest.mark.parametrize("variant", ["grpo", "sapo", "gspo", "fipo", "is_reshape", "default", "cispo"])
def test_extreme_ratio_in_a_longer_sample_is_finite(variant):
    # The extreme token shares its sample with normal ones: sequence statistics (GSPO's s_i, the
    # geometric-mean mask, FIPO's future sum) must stay finite too.
    cfgs = [{"type": variant}] + ([{"type": "fipo", "detach_influence": False}] if variant == "fipo" else [])
    for lq in (-89.0, -1e4, -INF):
        for cfg in cfgs:
            step(cfg, [batch([-1.0, 0.0, -0.5], [-1.1, lq, -0.6], [1.0, 1.0, 1.0], [3])])


def test_unclipped_gradient_is_exact_inside_the_bound_and_zero_beyond():
    # vanilla: grad = -r A exactly for |log r| <= 20; beyond, r is the constant e^20.
    for log_r, expect in ((19.5, -math.exp(19.5)), (-19.5, -math.exp(-19.5)), (20.5, 0.0), (-20.5, 0.0)):
        inputs = batch([0.0], [-log_r], [1.0], [1], dtype=torch.float64)
        out = build_loss({"type": "vanilla"})(inputs, LossScale(1, 1, 1))
        (grad,) = torch.autograd.grad(out.loss, inputs.trainer_logprobs)
        assert grad.item() == pytest.approx(expect, rel=1e-12, abs=0)
        assert reduce_metrics([out.metrics])["loss/ratio_clamped_frac"] == (abs(log_r) > 20)


def test_k3_kl_is_finite_below_float32_exp_range():
    # Exact for d >= -20; below, exp(-d) is continued by its tangent at -20.
    for d in (-5.0, -20.0, -100.0, -1e4):
        lp = torch.tensor([d], requires_grad=True)
        kl = kl_estimate(lp, torch.zeros(1), "k3")
        (grad,) = torch.autograd.grad(kl.sum(), lp)
        b = min(-d, 20.0)
        expect_value = math.exp(b) * (1 - (d + b)) + d - 1
        assert torch.isfinite(kl).all() and torch.isfinite(grad).all()
        assert kl.item() == pytest.approx(expect_value, rel=1e-5)
        assert grad.item() == pytest.approx(1 - math.exp(b), rel=1e-5)


def test_nan_logprob_on_a_trained_token_is_not_hidden():
    inputs = batch([-1.0, float("nan")], [-1.0, -1.0], [1.0, 1.0], [2])
    assert not torch.isfinite(compute_step_loss({"type": "grpo"}, [inputs], max_tokens=4).loss)


# ---------------------------------------------------------------------------------------------
# Item 13: logged statistics are finite and comparable
# ---------------------------------------------------------------------------------------------


def test_ratio_metrics_are_finite_with_an_overflowing_ratio():
    inputs = batch([0.0, -1.0], [-1e4, -1.0], [1.0, 1.0], [1, 1])
    _, _, metrics = step({"type": "dapo"}, [inputs])
    assert metrics["loss/importance_ratio"] == pytest.approx((math.exp(20) + 1) / 2, rel=1e-5)
    assert metrics["loss/mismatch_kl"] == pytest.approx((math.exp(20) - 21) / 2, rel=1e-5)
    assert metrics["loss/ratio_clamped_frac"] == 0.5


@pytest.mark.parametrize(
    "cfg",
    [
        {"type": "cispo", "eps_low": 0.2},
        {"type": "default", "ratio_type": "sequence"},
        {"type": "gspo", "eps_low": 0.9, "eps_high": 9.0},
        {"type": "is_reshape"},
    ],
)
def test_soft_gate_weight_is_bounded_by_one(cfg):
    # Small ratios make w_t (the gradient weight relative to r A) > 1; the logged mean is of min(w_t, 1).
    # log r = [1.5, -0.3 | -0.1, -2.5]
    lp = [-0.5, -2.3, -2.1, -4.5]
    _, _, metrics = step(cfg, [batch(lp, [-2.0] * 4, [1.0, 1.0, 1.0, 1.0], [2, 2])])
    assert 0 <= metrics["loss/soft_gate_weight"] <= 1
    assert metrics["loss/soft_gate_amplified_frac"] > 0


def test_dropped_tokens_are_left_out_of_per_token_metrics():
    inputs = batch([-1.0, -INF, -2.0], [-1.0, -1.0, -2.0], [1.0, 1.0, 1.0], [3])
    _, grads, metrics = step({"type": "vanilla"}, [inputs])
    assert metrics["loss/importance_ratio"] == 1.0 and metrics["loss/nonfinite_ratio_frac"] == pytest.approx(1 / 3)
    # Still counted in the token denominator (3 trained tokens), so each kept token has grad -A / 3.
    assert grads[0].tolist() == pytest.approx([-1 / 3, 0.0, -1 / 3])


# ---------------------------------------------------------------------------------------------
# Item 11: OPSM's advantage condition is per token
# ---------------------------------------------------------------------------------------------


OPSM = {"type": "grpo", "opsm_delta": 0.1, "eps_low": 0.9, "normalization": "token"}  # LossScale(1, ...): a sum


def test_opsm_masks_negative_tokens_not_the_whole_sample():
    # One sample that drifted (mean(lq - lp) = 0.5 > delta) with token advantages of both signs.
    adv = [1.0, -1.0, 2.0, -0.5]
    inputs = batch([-1.5] * 4, [-1.0] * 4, adv, [4], dtype=torch.float64)
    out = build_loss(OPSM)(inputs, LossScale(1, 1, 1))
    (grad,) = torch.autograd.grad(out.loss, inputs.trainer_logprobs)
    r = math.exp(-0.5)
    assert grad.tolist() == pytest.approx([-r * 1.0, 0.0, -r * 2.0, 0.0])
    assert reduce_metrics([out.metrics])["loss/opsm_masked_frac"] == 0.5
    # A sample whose mean advantage is negative keeps its positive tokens.
    inputs = batch([-1.5] * 2, [-1.0] * 2, [0.5, -2.0], [2], dtype=torch.float64)
    out = build_loss(OPSM)(inputs, LossScale(1, 1, 1))
    (grad,) = torch.autograd.grad(out.loss, inputs.trainer_logprobs)
    assert grad.tolist() == pytest.approx([-r * 0.5, 0.0])


# ---------------------------------------------------------------------------------------------
# Item 12: bnpo = sum(l) / sum(T) over the step; dr_grpo's N
# ---------------------------------------------------------------------------------------------


def two_micro_batches(mask_second_sample: bool = False) -> list[LossInputs]:
    lp = torch.tensor([-1.0, -0.5, -2.0, -0.3, -1.2], dtype=torch.float64, requires_grad=True)
    lq = torch.tensor([-1.1, -0.6, -1.9, -0.3, -1.0], dtype=torch.float64)
    adv = torch.tensor([0.7, 0.7, -0.4, -0.4, 1.5], dtype=torch.float64)
    mask = torch.tensor([True, True, not mask_second_sample, not mask_second_sample, True])
    return [LossInputs(lp[:4], lq[:4], adv[:4], mask[:4], torch.tensor([2, 2])),
            LossInputs(lp[4:], lq[4:], adv[4:], mask[4:], torch.tensor([1]))]  # fmt: skip


def test_bnpo_is_the_token_sum_over_the_step_divided_by_its_tokens():
    mbs = two_micro_batches()
    bnpo = compute_step_loss({"type": "bnpo"}, mbs, max_tokens=4).loss.item()
    per_token = compute_step_loss({"type": "grpo", "normalization": "token"}, mbs, max_tokens=4).loss.item() * 5
    local = compute_step_loss({"type": "bnpo", "normalization": "token_local"}, mbs, max_tokens=4).loss.item()
    assert bnpo == pytest.approx(per_token / 5)  # sum(l) / sum(T), T = 5 trained tokens
    assert bnpo != pytest.approx(local)


def test_dr_grpo_counts_samples_with_a_trained_token():
    # sum(l) / (N * L): the second sample of the first micro-batch has no trained token, so N = 2, not 3.
    mbs = two_micro_batches(mask_second_sample=True)
    dr = compute_step_loss({"type": "dr_grpo"}, mbs, max_tokens=4).loss.item()
    token_mean = compute_step_loss({"type": "dr_grpo", "normalization": "token"}, mbs, max_tokens=4).loss.item()
    assert dr == pytest.approx(token_mean * 3 / (2 * 4))  # 3 trained tokens


# ---------------------------------------------------------------------------------------------
# Item 7: token_local counts only micro-batches with a trained token
# ---------------------------------------------------------------------------------------------


def padding() -> LossInputs:
    zero = torch.zeros(1, dtype=torch.float64)
    return LossInputs(zero.clone().requires_grad_(), zero, zero, torch.zeros(1, dtype=torch.bool), torch.tensor([1]))


@pytest.mark.parametrize("variant", ["bnpo", "grpo"])
def test_token_local_ignores_padding_micro_batches(variant):
    cfg = {"type": variant, "normalization": "token_local"}
    mbs = two_micro_batches()
    base = compute_step_loss(cfg, mbs, max_tokens=4)
    (g_base,) = torch.autograd.grad(base.loss, mbs[0].trainer_logprobs)
    padded = compute_step_loss(cfg, [*mbs, padding(), padding()], max_tokens=4)
    (g_padded,) = torch.autograd.grad(padded.loss, mbs[0].trainer_logprobs)
    assert padded.loss.item() == pytest.approx(base.loss.item(), rel=1e-12)
    assert torch.allclose(g_padded, g_base, rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------------
# Item 14: loss/teacher_kl, FIPO's decay over trained tokens, low_var_kl's clamp
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [{"type": "sapo", "teacher_tau": 0.5}, {"type": "sapo"}, {"type": "grpo"}])
def test_teacher_kl_is_logged_when_teacher_logprobs_are_present(cfg):
    inputs = batch([-1.0, -0.5, -2.0], [-1.1, -0.5, -2.0], [1.0, -1.0, 0.5], [2, 1], mask=[True, True, False],
                   teacher_logprobs=[-0.4, -0.9, float("nan")])  # fmt: skip
    _, _, metrics = step(cfg, [inputs])
    assert metrics["loss/teacher_kl"] == pytest.approx(((-1.0 + 0.4) + (-0.5 + 0.9)) / 2)
    without = batch([-1.0], [-1.0], [1.0], [1])
    assert "loss/teacher_kl" not in step({"type": "sapo"}, [without])[2]


def test_fipo_decay_counts_trained_tokens_not_positions():
    # Trained, masked (an environment token), trained: f_0 = exp(log r_0 + gamma log r_2), the masked
    # token adds no decay step (with positions it would be gamma^2).
    lp, lq = [-1.0, -3.0, -1.0], [-1.05, -1.0, -1.1]
    inputs = batch(lp, lq, [1.0, 1.0, 1.0], [3], mask=[True, False, True], dtype=torch.float64)
    metrics = reduce_metrics([build_loss({"type": "fipo", "gamma": 0.5})(inputs, LossScale(2, 1, 4)).metrics])
    f0 = math.exp(0.05 + 0.5 * 0.1)
    f2 = math.exp(0.1)
    assert metrics["loss/future_influence"] == pytest.approx((f0 + f2) / 2)


def test_low_var_kl_clamps_d_to_twenty():
    ref = torch.zeros(3)
    lp = torch.tensor([-20.0, -30.0, 40.0])
    kl = kl_estimate(lp, ref, "low_var_kl")
    assert kl.tolist() == pytest.approx([10.0, 10.0, 10.0])  # k3(-20) = e^20 - 21, then clamped to 10
    assert kl_estimate(torch.tensor([-2.0]), torch.zeros(1), "low_var_kl").item() == pytest.approx(math.exp(2) - 3)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lp, lq", [(0.0, -30.0), (-30.0, 0.0)])
@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_the_gate_is_zero_exactly_where_the_ratio_clamp_zeroes_the_gradient(variant, lp, lq, adv):
    """A token with |log r| = 30 > B: for the variants whose gradient flows through log r the clamp leaves it no
    gradient, and `loss/soft_gate_weight` must say 0 (not the closed form of the unclamped gate); the gradient of
    CISPO and gspo_token reaches lp directly, and where it is not 0 their gate is not either."""
    _, grads, metrics = step({"type": variant}, [batch([lp], [lq], [adv], [1])])
    assert metrics["loss/ratio_clamped_frac"] == 1.0
    has_gradient = grads[0][0].item() != 0.0
    assert (metrics["loss/soft_gate_weight"] > 0) == has_gradient, (grads[0], metrics["loss/soft_gate_weight"])
    assert metrics["loss/soft_gate_amplified_frac"] <= float(has_gradient)
    assert not has_gradient or variant in ("cispo", "gspo_token")

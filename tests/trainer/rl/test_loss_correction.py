"""`[loss.correction]`: equal to verl's `rollout_corr_helper` (run from verl's own wheel) for every verl preset, at
the edges; the other peers' settings by their definitions; today's default as rules; every variant x correction
against autograd; bad settings refused at config time."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.configs.loss import CORRECTION_PRESETS, LOSSES
from prime_rl.trainer.rl.loss import STEP_STATISTICS, build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale, reduce_metrics, token_view
from tests.support.peer_code import verl_modules
from tests.trainer.rl.test_losses import SUM

VERL_PRESETS = [name for name in CORRECTION_PRESETS if name.startswith(("decoupled_", "bypass_"))]
VARIANTS = [name for name in LOSSES.names if name != "custom"]


def padded_batch(seed: int, rows: int = 6, width: int = 9, drift: float = 0.3, small_drift_rows: int = 2):
    """[rows, width] float32 x, lq and a response mask with every row holding a valid token; some rows drift
    little (|x - lq| ~ 1e-4, around Geo-RS's 0.999-1.001 window), the others by `drift`."""
    gen = torch.Generator().manual_seed(seed)
    lq = torch.randn(rows, width, generator=gen) * 0.5 - 1.5
    scale = torch.full((rows, 1), drift)
    scale[:small_drift_rows] = 3e-4
    x = lq + torch.randn(rows, width, generator=gen) * scale
    mask = torch.rand(rows, width, generator=gen) > 0.2
    mask[:, 0] = True
    return x, lq, mask


def packed(x, lq, mask, lp=None) -> LossInputs:
    """The padded rows as one packed micro-batch: row i is sample i (its padding untrained)."""
    rows, width = x.shape
    lp = (x if lp is None else lp).reshape(-1).clone().requires_grad_()
    return LossInputs(lp, lq.reshape(-1), torch.ones(rows * width), mask.reshape(-1), torch.full((rows,), width),
                      old_logprobs=x.reshape(-1))


def ours(cfg: dict, inputs: LossInputs, scale: LossScale | None = None):
    """The correction of `cfg` on `inputs` (as `Loss` computes it) and its reduced metrics."""
    loss = build_loss(cfg)
    if scale is None and loss.needs_step_pass:
        scale = loss.with_step_statistics(SUM, loss.step_statistics(inputs))
    full, correction = loss.prepare(inputs, scale)
    return correction, reduce_metrics([correction.metrics])


def verl_call(helper, algorithm, preset: str, x, lq, mask, batch_normalize: bool = False):
    settings = getattr(algorithm.RolloutCorrectionConfig, preset)()
    weights, new_mask, metrics = helper.compute_rollout_correction_and_rejection_mask(
        old_log_prob=x, rollout_log_prob=lq, response_mask=mask.float(), rollout_is=settings.rollout_is,
        rollout_is_threshold=settings.rollout_is_threshold, rollout_is_batch_normalize=batch_normalize,
        rollout_rs=settings.rollout_rs, rollout_rs_threshold=settings.rollout_rs_threshold)
    w = None if weights is None else weights.batch["rollout_is_weights"]
    return w, new_mask.bool(), {k.removeprefix("rollout_corr/"): v for k, v in metrics.items()}


def preset_config(preset: str) -> dict:
    kind = "vanilla" if preset.startswith("bypass_pg") else "grpo"
    return {"type": kind, "correction": {"preset": preset}}


SAME_METRICS = {  # ours -> verl's, where the names mean the same thing
    "correction/kl": "kl", "correction/k3_kl": "k3_kl", "correction/training_ppl": "training_ppl",
    "correction/rollout_ppl": "rollout_ppl", "correction/log_ppl_diff": "log_ppl_diff",
    "correction/chi2_token": "chi2_token", "correction/chi2_seq": "chi2_seq",
    "correction/rejected_frac": "rollout_rs_masked_fraction", "correction/rejected_seq_frac":
    "rollout_rs_seq_masked_fraction", "correction/is_weight": "rollout_is_mean",
    "correction/is_weight_ess": "rollout_is_eff_sample_size",
}


def assert_equal_to_verl(preset, x, lq, mask, compare_metrics=True, batch_normalize=False):
    helper, algorithm = verl_modules()
    cfg = preset_config(preset)
    if batch_normalize:
        cfg["correction"]["weight_batch_normalize"] = True
    # verl's bypass mode calls the helper with the current policy as old_log_prob: x = sg(lp) there.
    lp = x if CORRECTION_PRESETS[preset]["old_logprobs"] != "trainer" else x + 0.05
    correction, metrics = ours(cfg, packed(x, lq, mask, lp))
    their_w, their_mask, their_metrics = verl_call(helper, algorithm, preset, x, lq, mask, batch_normalize)
    valid = mask.reshape(-1)
    assert torch.equal(correction.keep[valid], their_mask.reshape(-1)[valid]), preset
    assert torch.equal(correction.valid, valid)
    if their_w is None:
        assert correction.weight is None
    else:
        torch.testing.assert_close(correction.weight[valid], their_w.reshape(-1)[valid], rtol=1e-6, atol=1e-6)
    if compare_metrics:
        for mine, theirs in SAME_METRICS.items():
            if theirs in their_metrics and mine in metrics:
                assert metrics[mine] == pytest.approx(their_metrics[theirs], rel=2e-5, abs=2e-6), (preset, mine)
        if CORRECTION_PRESETS[preset].get("weight") == "token":
            assert metrics["correction/is_weight_max"] == pytest.approx(their_metrics["rollout_is_max"], rel=1e-6)


@pytest.mark.parametrize("preset", VERL_PRESETS)
def test_every_verl_preset_equals_verls_helper_on_random_batches(preset):
    for seed in range(8):
        assert_equal_to_verl(preset, *padded_batch(seed))


@pytest.mark.parametrize("preset", ["decoupled_token_is", "decoupled_seq_is", "decoupled_token_icepop"])
def test_batch_normalized_weights_equal_verls(preset):
    for seed in range(4):
        assert_equal_to_verl(preset, *padded_batch(seed), batch_normalize=True)


@pytest.mark.parametrize("preset", VERL_PRESETS)
def test_every_verl_preset_equals_verls_helper_at_the_edges(preset):
    # One-token samples, |log rho| = 30 both ways (past the clamp B = 20), ratios exactly on 1/2, 2, 1/8 and 8
    # (powers of two: exact in float32 and in log space), a drift of exactly 0.
    x = torch.tensor([[-1.0, -2.0, -3.0], [30.0 - 40, -1.0, -1.0], [-40.0, -0.5, -0.7], [-1.0, -1.0, -1.0],
                      [math.log(2) - 1, -1.0, -1.0], [-math.log(8) - 2, -2.0, -2.0]])
    lq = torch.tensor([[-1.0, -9.0, -9.0], [-40.0, -1.0, -1.0], [-10.0, -0.5, -0.7], [-1.0, -1.0, -1.0],
                       [-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[True, False, False], [True, True, False], [True, True, True], [True, True, True],
                         [True, False, False], [True, True, False]])
    assert_equal_to_verl(preset, x, lq, mask)


@pytest.mark.parametrize("preset", VERL_PRESETS)
def test_a_fully_masked_sample_is_neither_kept_nor_weighted(preset):
    # verl counts an all-padding row in its per-sequence means (ppl 1); we leave it out, so only masks and weights
    # are compared with one in the batch.
    x, lq, mask = padded_batch(3)
    mask[2] = False
    assert_equal_to_verl(preset, x, lq, mask, compare_metrics=False)
    correction, _ = ours(preset_config(preset), packed(x, lq, mask))
    assert not correction.keep.reshape(mask.shape)[2].any()


def test_openrlhf_slime_and_areal_settings_follow_their_definitions():
    x, lq, mask = padded_batch(5, drift=0.8)
    rho = torch.exp((x - lq).clamp(-20, 20)).reshape(-1)
    valid = mask.reshape(-1)
    inputs = packed(x, lq, mask)
    tis, _ = ours({"type": "grpo", "correction": {"preset": "openrlhf_tis"}}, inputs)
    torch.testing.assert_close(tis.weight[valid], rho.clamp(0.5, 5.0)[valid])  # two-sided clamp
    slime, _ = ours({"type": "grpo", "correction": {"preset": "slime_tis"}}, inputs)
    torch.testing.assert_close(slime.weight[valid], rho.clamp(0.0, 2.0)[valid])
    icepop, _ = ours({"type": "grpo", "correction": {"preset": "slime_icepop"}}, inputs)
    # slime's icepop_function with its default clips (tis_clip_low = 0, tis_clip = 2)
    torch.testing.assert_close(icepop.weight[valid], torch.where((rho >= 0.0) & (rho <= 2.0), rho, 0)[valid])
    smt, _ = ours({"type": "grpo", "correction": {"preset": "openrlhf_seq_mask_tis"}}, inputs)
    geo = torch.exp(((x - lq) * mask).sum(1) / mask.sum(1))
    inside = ((geo >= 0.5) & (geo <= 5.0))[:, None].expand_as(mask).reshape(-1)
    torch.testing.assert_close(smt.weight[valid], rho[valid])  # rho not truncated
    assert torch.equal(smt.keep[valid], inside[valid])
    areal, _ = ours({"type": "grpo", "correction": {"preset": "areal_decoupled"}}, inputs)
    torch.testing.assert_close(areal.weight[valid], rho[valid])
    assert torch.equal(areal.keep[valid], (rho <= 5.0)[valid])


def test_veto_rejects_a_sample_with_one_token_below_the_floor():
    x = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -12.0, -1.0]])
    lq = torch.tensor([[-1.0, -1.1, -1.0], [-1.0, -1.0, -1.0]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    correction, metrics = ours({"type": "grpo", "correction": {"old_logprobs": "trainer", "reject": [
        {"rule": "veto", "low": 1e-4}]}}, packed(x, lq, mask))
    assert correction.keep.tolist() == [True] * 3 + [False] * 3
    assert metrics["correction/rejected_seq_frac"] == 0.5


def random_packed(seed: int):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 12, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen)
    t = int(lens.sum())
    lq = torch.randn(t, generator=gen) * 0.7 - 1.5
    log_r = torch.randn(t, generator=gen) * float(torch.rand(1, generator=gen) * 3)
    log_r[torch.rand(t, generator=gen) < 0.05] *= 4  # a few far outliers (past 100 and below 1/8)
    lp = (lq + log_r).requires_grad_()
    adv = torch.repeat_interleave(torch.randn(len(lens), generator=gen), lens)
    mask = torch.rand(t, generator=gen) > 0.15
    return LossInputs(lp, lq, adv, mask, lens)


NO_MASKS = {"token_mask_low": 0.0, "token_mask_high": 1e30, "geo_mask_low": 0.0, "geo_mask_high": 1e30,
            "sequence_mask_low": 0.0, "sequence_mask_high": 1e30}
DEFAULT_AS_RULES = {**NO_MASKS, "correction": {"reject": [
    {"rule": "token_k1", "low": 0.125, "high": 8.0}, {"rule": "seq_mean_k1", "low": 0.1, "high": 10.0},
    {"rule": "veto", "high": 100.0}]}}


@pytest.mark.slow
def test_the_default_written_as_rules_masks_exactly_what_the_default_masks():
    # token_k1 0.125-8 + seq_mean_k1 0.1-10 (verl's rules) + a veto on any token ratio above 100 (ours, no verl
    # rule); sampler mode, so rho = exp(sg(lp) - lq) = r.
    for seed in range(200):
        inputs = random_packed(seed)
        default = build_loss({"type": "default"})(inputs, SUM, outcomes=True)
        rules = build_loss({"type": "default", **DEFAULT_AS_RULES})(inputs, SUM, outcomes=True)
        assert torch.equal(default.outcomes == 1, rules.outcomes == 1), seed  # the kept tokens
        assert torch.equal(default.outcomes == 0, rules.outcomes == 0), seed
        (g_default,) = torch.autograd.grad(default.loss, inputs.trainer_logprobs)
        (g_rules,) = torch.autograd.grad(rules.loss, inputs.trainer_logprobs)
        assert torch.equal(g_default, g_rules), seed
        assert default.loss.item() == rules.loss.item()


CORRECTIONS = {
    "token_tis": {"old_logprobs": "trainer", "weight": "token", "weight_cap": 1.5},
    "seq_is_current": {"old_logprobs": "current", "weight": "sequence", "weight_cap": 3.0},
    "icepop_geo_rs": {"old_logprobs": "trainer", "weight": "token", "weight_bounds": [0.7, 1.4],
                      "reject": [{"rule": "seq_mean_k1", "low": 0.8, "high": 1.25}]},
    "k3_max_and_veto_bypass": {"reject": [{"rule": "seq_max_k3", "high": 0.3}, {"rule": "veto", "low": 0.2}]},
    "normalized_two_sided": {"old_logprobs": "trainer", "weight": "token", "weight_floor": 0.8, "weight_cap": 1.3,
                             "weight_batch_normalize": True, "reject": [{"rule": "token_k2", "high": 0.2}]},
}


@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gradient_of_every_variant_with_every_correction_matches_autograd(variant, correction):
    # The corrected loss is sum_t w_t l_t over the kept tokens, l_t the variant's own per-token loss against the
    # correction's old policy: rebuilt here from the variant's function on inputs whose loss mask is the kept
    # tokens, differentiated by autograd, and compared with the loss's gradient.
    gen = torch.Generator().manual_seed(7)
    lens = torch.tensor([1, 4, 7, 3, 10, 5])
    t = int(lens.sum())
    lq = torch.randn(t, generator=gen, dtype=torch.float64) * 0.5 - 1
    lo = lq + torch.randn(t, generator=gen, dtype=torch.float64) * 0.3
    lp_values = lo + torch.randn(t, generator=gen, dtype=torch.float64) * 0.2
    adv = torch.repeat_interleave(torch.randn(len(lens), generator=gen, dtype=torch.float64), lens)
    mask = torch.rand(t, generator=gen) > 0.1
    cfg = {"type": variant, "normalization": "token", "correction": CORRECTIONS[correction]}
    lp = lp_values.clone().requires_grad_()
    inputs = LossInputs(lp, lq, adv, mask, lens, old_logprobs=lo)
    loss_fn = build_loss(cfg)
    scale = loss_fn.with_step_statistics(SUM, loss_fn.step_statistics(inputs)) if loss_fn.needs_step_pass else SUM
    (grad,) = torch.autograd.grad(loss_fn(inputs, scale).loss, lp)

    full, correction_ = loss_fn.prepare(inputs, scale)
    old = {"trainer": lo, "sampler": lq}.get(CORRECTIONS[correction].get("old_logprobs", "sampler"))
    lp_ref = lp_values.clone().requires_grad_()
    ref_inputs = LossInputs(lp_ref, lp_ref.detach() if old is None else old, adv, correction_.keep, lens)
    ref_cfg = loss_fn.config.model_copy(update={"correction": type(loss_fn.config.correction)()})
    view = token_view(ref_inputs, scale)
    term = LOSSES.implementation(variant)(ref_cfg, view)
    weight = correction_.weight if correction_.weight is not None else torch.ones_like(lp_values)
    (expected,) = torch.autograd.grad((weight * term.loss).sum(), lp_ref)
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)
    assert grad[~correction_.keep].abs().max() == 0  # rejected and untrained tokens get no gradient


def test_step_statistics_make_the_weight_mean_a_statistic_of_the_whole_step():
    # Split into micro-batches, the normalized weights equal the one-batch ones (the mean is the step's).
    cfg = {"type": "grpo", "correction": CORRECTIONS["normalized_two_sided"]}
    x, lq, mask = padded_batch(2)
    whole = packed(x, lq, mask)
    parts = [packed(x[:3], lq[:3], mask[:3]), packed(x[3:], lq[3:], mask[3:])]
    loss_fn = build_loss(cfg)
    sums = sum((loss_fn.step_statistics(p) for p in parts), torch.zeros(STEP_STATISTICS, dtype=torch.float64))
    scale = loss_fn.with_step_statistics(SUM, sums)
    whole_w = loss_fn.prepare(whole, loss_fn.with_step_statistics(SUM, loss_fn.step_statistics(whole)))[1].weight
    split_w = torch.cat([loss_fn.prepare(p, scale)[1].weight for p in parts])
    torch.testing.assert_close(split_w, whole_w)


def test_trainer_old_logprobs_equal_to_the_sampler_give_the_sampler_form():
    inputs = random_packed(3)
    lq = inputs.inference_logprobs
    on_policy = LossInputs(inputs.trainer_logprobs, lq, inputs.advantages, inputs.loss_mask, inputs.sample_lens,
                           old_logprobs=lq.clone())
    sampler = build_loss({"type": "dapo"})(on_policy, SUM)
    trainer = build_loss({"type": "dapo", "correction": {"old_logprobs": "trainer", "weight": "token"}})(on_policy, SUM)
    assert trainer.loss.item() == pytest.approx(sampler.loss.item(), rel=1e-12, abs=1e-12)
    metrics = reduce_metrics([trainer.metrics])
    assert metrics["correction/is_weight"] == 1.0 and metrics["correction/kl"] == 0.0


def test_trainer_mode_without_old_logprobs_says_what_is_missing():
    with pytest.raises(ValueError, match="old_logprobs"):
        build_loss({"type": "grpo", "correction": {"old_logprobs": "trainer"}})(random_packed(0), SUM)


@pytest.mark.parametrize("bad, message", [
    ({"type": "grpo", "correction": {"preset": "decoupled_token_icepop", "weight_bounds": [5.0, 0.5]}}, "l < u"),
    ({"type": "grpo", "correction": {"weight_bounds": [1.0, 1.0], "weight": "token", "old_logprobs": "trainer"}},
     "l < u"),
    ({"type": "grpo", "correction": {"old_logprobs": "trainer", "weight": "token", "weight_cap": 0}}, "greater than 0"),
    ({"type": "grpo", "correction": {"old_logprobs": "trainer", "weight": "token", "weight_cap": -1}},
     "greater than 0"),
    ({"type": "grpo", "correction": {"preset": "verl_magic"}}, "unknown correction preset"),
    ({"type": "grpo", "correction": {"reject": [{"rule": "token_k4", "high": 1}]}}, "token_k4"),
    ({"type": "grpo", "correction": {"reject": [{"rule": "seq_mean_k3", "low": 0.1, "high": 1}]}}, "not low"),
    ({"type": "grpo", "correction": {"reject": [{"rule": "seq_mean_k1", "low": 2, "high": 1}]}}, "smaller than"),
    ({"type": "grpo", "correction": {"reject": [{"rule": "token_k2"}]}}, "needs high"),
    ({"type": "grpo", "correction": {"weight": "token"}}, "by itself"),
    ({"type": "grpo", "correction": {"preset": "bypass_pg_is"}}, "type = 'vanilla'"),
    ({"type": "sapo", "correction": {"preset": "bypass_ppo_clip_geo_rs"}}, "PPO clip"),
])
def test_bad_correction_settings_are_refused_with_a_reason(bad, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        build_loss(bad)


def test_a_summed_custom_loss_cannot_be_corrected_per_token():
    from prime_rl.utils.errors import ConfigError

    cfg = {"type": "custom", "import_path": "tests.trainer.rl.test_loss_correction:summed_loss",
           "correction": {"reject": [{"rule": "token_k1", "high": 2.0}]}}
    with pytest.raises(ConfigError, match="per-token losses"):
        build_loss(cfg)(random_packed(0), SUM)


def summed_loss(inputs: LossInputs) -> torch.Tensor:
    return -(inputs.advantages * inputs.trainer_logprobs).sum()


def test_rejected_tokens_read_r_in_the_token_outcomes_and_stay_in_the_denominator():
    inputs = random_packed(11)
    cfg = {"type": "grpo", "normalization": "token", "correction": {"reject": [{"rule": "token_k1", "low": 0.5,
                                                                                   "high": 2.0}]}}
    counts = int(inputs.loss_mask.sum())
    scale = LossScale(total_loss_tokens=counts, num_samples=1, max_tokens=1)
    out = build_loss(cfg)(inputs, scale, outcomes=True)
    rho = torch.exp(inputs.trainer_logprobs.detach() - inputs.inference_logprobs)
    outside = inputs.loss_mask & ((rho < 0.5) | (rho > 2.0))
    assert torch.equal(out.outcomes == 5, outside)
    assert reduce_metrics([out.metrics])["correction/rejected_frac"] == pytest.approx(
        int(outside.sum()) / counts)


def test_no_cap_is_written_none_in_toml():
    import tomllib

    from prime_rl.trainer.rl.loss import parse_loss_config

    text = '[loss]\ntype = "grpo"\n[loss.correction]\npreset = "decoupled_token_is"\nweight_cap = "none"\n'
    config = parse_loss_config(tomllib.loads(text)["loss"])
    assert math.isinf(config.correction.weight_cap) and config.correction.weight == "token"
    x, lq, mask = padded_batch(1, drift=2.0)
    correction, _ = ours({"type": "grpo", "correction": {"preset": "decoupled_token_is", "weight_cap": "none"}},
                         packed(x, lq, mask))
    assert correction.weight.max() > 2.0  # not truncated


@pytest.mark.parametrize("rule", [{"rule": "veto", "low": 1e-4}, {"rule": "seq_mean_k1", "low": 0.5, "high": 2.0},
                                  {"rule": "seq_sum_k1", "low": 0.5, "high": 2.0}])
@pytest.mark.parametrize("mode", ["sampler", "trainer"])
def test_a_token_the_trainer_finds_impossible_rejects_its_sample(rule, mode):
    # lp (or lo) = -inf on one token (the sampler's token outside the trainer's top-p set): the token is dropped from
    # the loss ('x'), and the rules see it at log rho = -20, so its whole sample is rejected ('r'), as in verl.
    lq = torch.full((8,), -1.0)
    lp = torch.full((8,), -1.0)
    lp[2] = -math.inf
    inputs = LossInputs(lp.clone().requires_grad_(), lq, torch.ones(8), torch.ones(8, dtype=torch.bool),
                        torch.tensor([5, 3]), old_logprobs=lp.clone())
    out = build_loss({"type": "grpo", "correction": {"old_logprobs": mode, "reject": [rule]}})(inputs, SUM,
                                                                                              outcomes=True)
    assert "".join("-klhxr"[c] for c in out.outcomes.tolist()) == "rrxrr" + "kkk"


def test_a_rule_listed_twice_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="listed twice"):
        build_loss({"correction": {"reject": [{"rule": "token_k1", "high": 2.0}, {"rule": "token_k1", "low": 0.5}]}})


@pytest.mark.parametrize("correction, unused", [
    ({"weight_bounds": [0.5, 5.0]}, "weight_bounds"),
    ({"weight_cap": 3.0, "reject": [{"rule": "token_k1", "high": 2.0}]}, "weight_cap"),
    ({"weight_batch_normalize": True, "old_logprobs": "trainer"}, "weight_batch_normalize"),
    ({"preset": "decoupled_token_icepop", "weight_floor": 0.1}, "weight_floor"),
])
def test_a_key_that_would_do_nothing_is_refused(correction, unused):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=f"{unused} would do nothing"):
        build_loss({"type": "grpo", "correction": correction})


def test_icepop_zeroed_tokens_read_r_and_loss_metrics_stay_against_the_sampler():
    x, lq, mask = padded_batch(4, drift=1.0)
    inputs = packed(x, lq, mask, lp=x + 0.1)
    out = build_loss({"type": "grpo", "correction": {"preset": "decoupled_token_icepop"}})(inputs, SUM, outcomes=True)
    rho = torch.exp(x - lq).reshape(-1)
    valid = mask.reshape(-1)
    zeroed = valid & ((rho < 0.5) | (rho > 5.0))
    assert zeroed.any() and torch.equal(out.outcomes == 5, zeroed)
    metrics = reduce_metrics([out.metrics])
    r = torch.exp(x + 0.1 - lq).reshape(-1)[valid].double()
    assert metrics["loss/importance_ratio"] == pytest.approx(float(r.mean()), rel=1e-5)  # lp vs lq, every token


def test_the_round_trip_through_toml_keeps_no_cap():
    import tomllib

    from prime_rl.configs.toml_io import dump_toml
    from prime_rl.trainer.config import TrainerConfig

    for correction in [{"preset": "openrlhf_seq_mask_tis"}, {"preset": "decoupled_token_is", "weight_cap": "none"}]:
        config = TrainerConfig.build([], {"loss": {"type": "grpo", "correction": correction}})
        again = TrainerConfig.build([], tomllib.loads(dump_toml(config.model_dump(mode="json"))))
        assert again.loss == config.loss and math.isinf(again.loss.correction.weight_cap)


def test_a_custom_inputs_loss_sees_the_sampler_and_only_the_kept_tokens():
    seen = {}

    def spy(inputs: LossInputs):
        seen.update(lq=inputs.inference_logprobs.clone(), mask=inputs.loss_mask.clone(), old=inputs.old_logprobs)
        return -(inputs.advantages * inputs.trainer_logprobs)

    x, lq, mask = padded_batch(6, drift=1.0)
    inputs = packed(x, lq, mask)
    import tests.trainer.rl.test_loss_correction as me

    me.spy_loss = spy
    cfg = {"type": "custom", "import_path": "tests.trainer.rl.test_loss_correction:spy_loss",
           "correction": {"old_logprobs": "trainer", "reject": [{"rule": "token_k1", "low": 0.5, "high": 2.0}]}}
    build_loss(cfg)(inputs, SUM)
    rho = torch.exp(x - lq).reshape(-1)
    assert torch.equal(seen["lq"], inputs.inference_logprobs) and seen["old"] is inputs.old_logprobs
    assert torch.equal(seen["mask"], mask.reshape(-1) & (rho >= 0.5) & (rho <= 2.0))


def test_the_weight_multiplies_the_policy_loss_and_not_the_kl_penalty():
    # l = sum_t w_t l_t + kl_coef sum_t k3(lp_t - ref_t) over the kept tokens: the regularizer is not weighted.
    from prime_rl.trainer.rl.losses import kl_estimate

    x, lq, mask = padded_batch(9, drift=0.6)
    lp_values = (x + 0.1).reshape(-1).double()
    ref = lp_values - 0.2
    cfg = {"type": "grpo", "normalization": "token", "kl_coef": 0.1,
           "correction": {"old_logprobs": "trainer", "weight": "token", "weight_cap": 1.5,
                          "reject": [{"rule": "token_k1", "low": 0.6, "high": 1.6}]}}
    lp = lp_values.clone().requires_grad_()
    inputs = LossInputs(lp, lq.reshape(-1).double(), torch.ones_like(lp_values), mask.reshape(-1),
                        torch.full((mask.shape[0],), mask.shape[1]), ref_logprobs=ref,
                        old_logprobs=x.reshape(-1).double())
    loss_fn = build_loss(cfg)
    (grad,) = torch.autograd.grad(loss_fn(inputs, SUM).loss, lp)
    _, correction = loss_fn.prepare(inputs, SUM)
    keep = correction.keep
    lp_ref = lp_values.clone().requires_grad_()
    view = token_view(LossInputs(lp_ref, inputs.old_logprobs, inputs.advantages, keep, inputs.sample_lens), SUM)
    term = LOSSES.implementation("grpo")(loss_fn.config, view)
    kl = torch.where(keep, kl_estimate(lp_ref, ref, "k3"), torch.zeros_like(lp_ref))
    (expected,) = torch.autograd.grad((correction.weight * term.loss).sum() + 0.1 * kl.sum(), lp_ref)
    assert (correction.weight[keep] != 1).any() and (~keep & mask.reshape(-1)).any()
    torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-12)

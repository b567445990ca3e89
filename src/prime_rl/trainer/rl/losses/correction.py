"""The rollout-correction stage, `[loss.correction]`, that every variant accepts (docs/losses.md#rollout-correction).

Three log-probabilities of each sampled token: lp (the trainer's, differentiable), lq (the sampler's), and x, the
old policy:

- the surrogate's ratio, the `r` every variant reads, is exp(lp - x_s) with x_s = lq (`old_logprobs = "sampler"`:
  two policies, verl's bypass mode), lo (`"trainer"`: a no-grad forward of the batch before its first update,
  decoupled PPO) or sg(lp) (`"current"`: r = 1 with the gradient of lp, the weight carries the whole correction);
- the behaviour ratio rho_t = exp(clamp(x_t - lq_t, -B, B)), x = lo (trainer) or sg(lp) (sampler, current), drives
  the importance weight (token, or the sample's product exp(clamp(sum_t (x_t - lq_t), -B, B))), truncated at C
  (TIS, with an optional floor) or zeroed outside [l, u] (IcePop), optionally divided by its step mean; and the
  rejection rules, which remove tokens or whole samples from the loss (they stay in its denominators).

Every rule is evaluated on the tokens as they came in, and the weight on all of them, as verl's
`rollout_corr_helper` does. Everything here is detached: the stage changes which tokens train and by how much, never
the gradient's path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from prime_rl.configs.loss import RULES_K1, CorrectionConfig, RejectionRule
from prime_rl.trainer.rl.losses.contract import LOG_RATIO_BOUND, TokenView
from prime_rl.trainer.rl.losses.inputs import LossInputs, LossScale
from prime_rl.trainer.rl.losses.loss_metrics import max_metric, scalar_metric, token_metric
from prime_rl.trainer.rl.losses.segments import (
    broadcast_to_tokens,
    segment_any,
    segment_masked_mean,
    segment_max,
    segment_sum,
)


def surrogate_old_logprobs(cfg: CorrectionConfig, inputs: LossInputs) -> Tensor:
    """x_s, the log-probability the surrogate's ratio r = exp(lp - x_s) is taken against."""
    if cfg.old_logprobs == "sampler":
        return inputs.inference_logprobs
    if cfg.old_logprobs == "current":
        return inputs.trainer_logprobs.detach()
    return recomputed_old_logprobs(inputs)


def recomputed_old_logprobs(inputs: LossInputs) -> Tensor:
    if inputs.old_logprobs is None:
        raise ValueError("loss.correction.old_logprobs = 'trainer' but LossInputs.old_logprobs is None (the trainer "
                         "fills it from a no-grad forward before the step's first update)")
    return inputs.old_logprobs


@dataclass
class Behaviour:
    """The behaviour log ratio d = x - lq of one micro-batch, detached. A trained token whose x or lq is -inf
    trains nothing (`valid` false) but the rules and sequence weights still see it, its d at -inf / +inf (0 when
    both are -inf), as verl's helper sees it: a token the trainer finds impossible rejects its sample under a veto or
    a Geo-RS rule instead of slipping past them."""

    valid: Tensor  # [T] bool: trained, lp, x_s, x and lq finite: the tokens that train and are measured
    seen: Tensor  # [T] bool: trained: the tokens the rules and sequence weights see
    d: Tensor  # [T] x - lq on `seen` (+-inf where one side is -inf), 0 elsewhere
    x: Tensor  # [T] x on `valid`, 0 elsewhere
    lq: Tensor  # [T] lq on `valid`, 0 elsewhere

    @property
    def log_rho(self) -> Tensor:
        """clamp(d, -B, B): log rho_t as the rules and token weights use it."""
        return self.d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def behaviour(cfg: CorrectionConfig, inputs: LossInputs, view: TokenView) -> Behaviour:
    lp = inputs.trainer_logprobs.detach()
    x = recomputed_old_logprobs(inputs).to(lp.dtype) if cfg.old_logprobs == "trainer" else lp
    lq = inputs.inference_logprobs.to(lp.dtype)
    valid = view.mask & (lq != -math.inf) & (x != -math.inf)
    seen = view.trained
    zero = torch.zeros_like(lp)
    d = torch.where(seen, torch.nan_to_num(x - lq, nan=0.0, posinf=math.inf, neginf=-math.inf), zero)
    return Behaviour(valid, seen, d, torch.where(valid, x, zero), torch.where(valid, lq, zero))


@dataclass
class Correction:
    """What the stage decided for one micro-batch (all [T], detached)."""

    valid: Tensor
    """bool: the trained tokens with finite logprobs (lp, lq and x)."""
    keep: Tensor
    """bool: the valid tokens every rule keeps."""
    weight: Tensor | None
    """The behaviour importance weight of each token (0 off `valid`), None without one."""
    metrics: dict[str, Tensor] = field(default_factory=dict)

    @property
    def rejected(self) -> Tensor:
        """bool: the valid tokens that train nothing because of the stage: rejected, or weighted 0 (IcePop)."""
        zeroed = self.weight == 0 if self.weight is not None else torch.zeros_like(self.keep)
        return self.valid & (~self.keep | zeroed)

    def apply_to(self, view: TokenView) -> TokenView:
        """`view` with the rejected and invalid tokens off its mask (their log r, r, lp and A reset as
        `token_view` does off the mask)."""
        mask = view.mask & self.keep
        zero = torch.zeros_like(view.log_r)
        log_r = torch.where(mask, view.log_r, zero)
        old = None if view.old is None else torch.where(mask, view.old, zero)
        return replace(view, lp=torch.where(mask, view.lp, zero), log_r=log_r, r=torch.exp(log_r),
                       adv=torch.where(mask, view.adv, zero), mask=mask, clamped=view.clamped & mask, old=old)


def rule_keeps(rule: RejectionRule, log_rho: Tensor, seen: Tensor, lens: Tensor) -> Tensor:
    """[T] bool: the tokens `rule` keeps (verl's `compute_rollout_rejection_mask` for the k rules, bounds inclusive;
    k1 rules compare log rho, or its sample sum or mean, with log(low) and log(high)), statistics over `seen`."""
    if rule.rule == "veto":
        rho = torch.exp(log_rho)
        out = torch.zeros_like(seen)
        if rule.low is not None:
            out = out | (seen & (rho < rule.low))
        if rule.high is not None:
            out = out | (seen & (rho > rule.high))
        return ~broadcast_to_tokens(segment_any(out, lens), lens)
    level, _, kind = rule.rule.rpartition("_")
    stat = {"k1": log_rho, "k2": 0.5 * log_rho**2, "k3": torch.exp(log_rho) - 1.0 - log_rho}[kind]
    if level == "seq_sum":
        stat = broadcast_to_tokens(segment_sum(torch.where(seen, stat, torch.zeros_like(stat)), lens), lens)
    elif level == "seq_mean":
        stat = broadcast_to_tokens(segment_masked_mean(stat, seen, lens), lens)
    elif level == "seq_max":
        stat = broadcast_to_tokens(segment_max(stat, seen, lens), lens)
    keep = torch.ones_like(seen)
    if rule.rule in RULES_K1:
        if rule.low is not None:
            keep = keep & (stat >= math.log(rule.low))
        if rule.high is not None:
            keep = keep & (stat <= math.log(rule.high))
        return keep
    return keep & (stat <= rule.high)


def raw_weights(cfg: CorrectionConfig, b: Behaviour, lens: Tensor) -> Tensor:
    """The untruncated behaviour weight of each valid token (0 elsewhere): rho_t, or the sample's
    exp(clamp(sum_t d_t, -B, B)) (the sum of the unclamped log ratios over its trained tokens, as verl)."""
    if cfg.weight == "token":
        log_w = b.log_rho
    else:
        seq = torch.nan_to_num(segment_sum(b.d, lens), nan=0.0)  # +inf and -inf in one sample: no information
        log_w = broadcast_to_tokens(seq.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), lens)
    return torch.where(b.valid, torch.exp(log_w), torch.zeros_like(b.d))


def truncate(cfg: CorrectionConfig, raw: Tensor) -> tuple[Tensor, Tensor]:
    """(w, outside): TIS clamp(raw, floor, C), or IcePop raw * 1[l <= raw <= u]; `outside`: where it acted."""
    if cfg.weight_bounds is not None:
        low, high = cfg.weight_bounds
        inside = (raw >= low) & (raw <= high)
        return torch.where(inside, raw, torch.zeros_like(raw)), ~inside
    return raw.clamp(min=cfg.weight_floor, max=cfg.weight_cap), (raw < cfg.weight_floor) | (raw > cfg.weight_cap)


def weight_statistics(cfg: CorrectionConfig, unnormalized: Correction, lens: Tensor) -> Tensor:
    """float64 `[sum of w, count]` over a micro-batch's valid tokens (`sequence`: over its samples) of the truncated
    weight before normalization (`correct` without a scale): summed over the step (all ranks), its mean divides the
    weights under `weight_batch_normalize`."""
    w, valid = unnormalized.weight, unnormalized.valid
    if cfg.weight == "sequence":
        return token_metric(segment_masked_mean(w, valid, lens), segment_any(valid, lens))
    return token_metric(w, valid)


def correct(cfg: CorrectionConfig, inputs: LossInputs, view: TokenView, scale: LossScale | None) -> Correction:
    """The stage's decision for one micro-batch: which tokens the rules keep, each token's weight, the metrics."""
    lens = view.sample_lens
    b = behaviour(cfg, inputs, view)
    log_rho = b.log_rho
    metrics: dict[str, Tensor] = {}
    keep = b.valid.clone()
    for rule in cfg.reject:
        kept = rule_keeps(rule, log_rho, b.seen, lens)
        metrics[f"correction/rejected_frac/{rule.rule}"] = token_metric(~kept, b.valid)
        keep = keep & kept
    if cfg.reject:
        metrics["correction/rejected_frac"] = token_metric(~keep, b.valid)
        metrics["correction/rejected_seq_frac"] = token_metric(segment_any(b.valid & ~keep, lens),
                                                               segment_any(b.valid, lens))
    weight = None
    if cfg.weight != "none":
        w, outside = truncate(cfg, raw_weights(cfg, b, lens))
        metrics["correction/is_weight"] = token_metric(w, b.valid)
        metrics["correction/is_weight_sq"] = token_metric(w.square(), b.valid)
        metrics["correction/is_weight_max"] = max_metric(w, b.valid)
        metrics["correction/is_weight_truncated_frac"] = token_metric(outside, b.valid)
        if cfg.weight_batch_normalize:
            mean = 1.0 if scale is None or scale.is_weight_mean is None else scale.is_weight_mean
            mean = mean if mean > 1e-8 else 1.0
            metrics["correction/batch_norm_factor"] = scalar_metric(mean)
            w = w / mean
        weight = torch.where(b.valid, w, torch.zeros_like(w))
    metrics.update(mismatch_metrics(b, lens))
    return Correction(valid=b.valid, keep=keep, weight=weight, metrics=metrics)


def mismatch_metrics(b: Behaviour, lens: Tensor) -> dict[str, Tensor]:
    """verl's off-policy diagnostics of the behaviour policy x against the sampler lq, in float64 over the valid
    tokens (per-sample ones over the samples with a valid token): kl = mean(lq - x), k3_kl = mean(e^d - d - 1),
    training / rollout perplexity exp(-mean_t x) / exp(-mean_t lq) averaged over samples, log_ppl_diff =
    mean_i(mean_t lq - mean_t x), chi2_token = mean(rho^2) - 1, chi2_seq = mean_i exp(2 clamp(sum_t d)) - 1."""
    valid = b.valid
    d64, x64, lq64 = (torch.where(valid, t, torch.zeros_like(t)).detach().to(torch.float64) for t in (b.d, b.x, b.lq))
    samples = segment_any(valid, lens)
    mean_x, mean_lq = segment_masked_mean(x64, valid, lens), segment_masked_mean(lq64, valid, lens)
    log_rho = d64.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq_log = segment_sum(torch.where(valid, d64, torch.zeros_like(d64)), lens).clamp(-LOG_RATIO_BOUND,
                                                                                       LOG_RATIO_BOUND)
    return {
        "correction/kl": token_metric(-d64, valid),
        "correction/k3_kl": token_metric(torch.exp(d64) - d64 - 1, valid),
        "correction/training_ppl": token_metric(torch.exp(-mean_x), samples),
        "correction/rollout_ppl": token_metric(torch.exp(-mean_lq), samples),
        "correction/log_ppl_diff": token_metric(mean_lq - mean_x, samples),
        "correction/chi2_token": token_metric(torch.exp(2 * log_rho) - 1, valid),
        "correction/chi2_seq": token_metric(torch.exp(2 * seq_log) - 1, samples),
    }

"""How a loss is chosen from `[loss]` and applied: the module to open first (the parts are in `losses/`).

    loss_fn = build_loss(config.loss)          # [loss] type -> its variant (configs/loss.py's LOSSES registry)
    out = loss_fn(inputs, scale)               # one micro-batch: LossInputs -> LossOutputs (loss, metrics)

`Loss.__call__` runs, for one micro-batch (`losses/inputs.py`'s `LossInputs`: the trainer's and the sampler's
logprobs, advantages, loss mask, packed sample lengths):
1. `prepare`: `losses/contract.token_view`, the ratio log r = lp - lo against the old policy the correction stage
   names (`losses/correction.surrogate_old_logprobs`), and the `[loss.correction]` decision (rejections, weights);
2. the variant registered for `[loss] type` (`losses/variants/`, `fn(cfg, view) -> PolicyTerm`) on the kept tokens,
   its per-token loss times the correction's weight;
3. plus the regularizers (`losses/regularizers`: KL to a reference or teacher, entropy), then the normalization
   (`losses/normalization`): the contribution already divided by the step's denominators in `LossScale`, so the
   step loss is the plain sum over micro-batches and ranks;
4. the metrics as float64 `[sum, count]` pairs (`losses/loss_metrics.reduce_metrics`), exact across micro-batches and
   ranks; with `outcomes`, each token's fate (`losses/contract.token_outcomes`).
A loss that reads the whole step (`needs_step_pass`) gets its statistics from a no-grad pre-pass first
(`step_statistics`, `with_step_statistics`); `compute_step_loss` does all of it for a list of micro-batches.
docs/losses.md has the math; docs/bring-your-own-algorithm.md how to add a variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from pydantic import TypeAdapter
from torch import Tensor

from prime_rl.configs.loss import LOSSES, LossConfig
from prime_rl.trainer.rl.losses.contract import (
    LOG_RATIO_BOUND,
    TokenView,
    log_ratio_moments_of,
    token_outcomes,
    token_view,
)
from prime_rl.trainer.rl.losses.correction import Correction, correct, surrogate_old_logprobs, weight_statistics
from prime_rl.trainer.rl.losses.inputs import LossInputs, LossOutputs, LossScale, scale_counts
from prime_rl.trainer.rl.losses.loss_metrics import reduce_metrics, token_metric
from prime_rl.trainer.rl.losses.normalization import normalize
from prime_rl.trainer.rl.losses.regularizers import regularizers

_CONFIG_ADAPTER: TypeAdapter[Any] = TypeAdapter(LossConfig)


def parse_loss_config(config: LossConfig | Mapping[str, Any]) -> LossConfig:
    """A loss config model, or a dict like {"type": "sapo", "tau_pos": 1.0} validated as `[loss]` is."""
    return _CONFIG_ADAPTER.validate_python(dict(config) if isinstance(config, Mapping) else config)


STEP_STATISTICS = 5
"""Length of `Loss.step_statistics`: `[sum log r, sum (log r)^2, count]` (`log_ratio_moments_of`), then
`[sum w, count]` (the correction's weights, `weight_statistics`)."""


class Loss:
    """The loss of one config: `loss(inputs, scale)` is one micro-batch's normalized contribution.

    Summing `loss` over all micro-batches of all ranks gives the step loss; metrics are pairs (see
    `reduce_metrics`). When `needs_step_pass` is true the loss reads statistics of the whole step (is_reshape's
    log-ratio moments, the correction's mean weight under `weight_batch_normalize`): run a no-grad pre-pass that sums
    `step_statistics` of every micro-batch (all ranks) and pass `with_step_statistics(scale, sums)`, as
    `compute_step_loss` and the trainer do. When `needs_old_logprobs` is true (`[loss.correction] old_logprobs =
    "trainer"`) every `LossInputs` carries `old_logprobs`, the policy's before the step's first update.
    """

    def __init__(self, config: LossConfig | Mapping[str, Any]):
        self.config = parse_loss_config(config)
        self._variant = LOSSES.implementation(self.config.type)
        self.correction = self.config.correction
        self.needs_log_ratio_moments = self.config.needs_log_ratio_moments
        self.normalizes_weights = self.correction.weight != "none" and self.correction.weight_batch_normalize
        self.needs_step_pass = self.needs_log_ratio_moments or self.normalizes_weights
        self.needs_old_logprobs = self.correction.old_logprobs == "trainer"

    def prepare(self, inputs: LossInputs, scale: LossScale | None) -> tuple[TokenView, Correction | None]:
        """The view the variant reads, its ratio taken against the correction's old policy, and the correction's
        decision (None when the stage is the default); the view is not yet restricted to the kept tokens."""
        cor = self.correction
        view = token_view(inputs, scale, old=surrogate_old_logprobs(cor, inputs))
        return view, correct(cor, inputs, view, scale) if cor.active else None

    def step_statistics(self, inputs: LossInputs) -> Tensor:
        """float64 [STEP_STATISTICS] of one micro-batch, no gradient: sum them over the step's micro-batches and
        ranks, then `with_step_statistics`."""
        out = torch.zeros(STEP_STATISTICS, dtype=torch.float64)
        with torch.no_grad():
            full, correction = self.prepare(inputs, None)
            if self.needs_log_ratio_moments:
                out[:3] = log_ratio_moments_of(correction.apply_to(full) if correction is not None else full).cpu()
            if self.normalizes_weights:
                out[3:] = weight_statistics(self.correction, correction, full.sample_lens).cpu()
        return out

    def with_step_statistics(self, scale: LossScale, sums: Tensor | Sequence[float]) -> LossScale:
        """`scale` carrying what the loss reads from the step's summed `step_statistics`."""
        values = [float(x) for x in (sums.tolist() if isinstance(sums, Tensor) else sums)]
        if self.needs_log_ratio_moments:
            scale = scale.with_log_ratio_moments(values[:3])
        if self.normalizes_weights and values[4] > 0:
            scale = dataclasses.replace(scale, is_weight_mean=values[3] / values[4])
        return scale

    def __call__(self, inputs: LossInputs, scale: LossScale, outcomes: bool = False) -> LossOutputs:
        """One micro-batch's share of the step loss and its metrics; with `outcomes`, each token's
        (`token_outcomes`)."""
        cfg = self.config
        full, correction = self.prepare(inputs, scale)
        p = full if correction is None else correction.apply_to(full)
        term = self._variant(cfg, p)
        if correction is not None and correction.weight is not None:
            term = replace(term, loss=term.loss * correction.weight, gate=term.gate * correction.weight)
        metrics = sampler_ratio_metrics(full, correction)
        metrics |= {
            "loss/clip_frac_low": token_metric(term.clip_low.float(), p.mask),
            "loss/clip_frac_high": token_metric(term.clip_high.float(), p.mask),
        }
        if cfg.type != "custom" or cfg.contract == "view":
            gate = term.gate.masked_fill(p.clamped, 0.0) if term.through_ratio else term.gate
            metrics["loss/soft_gate_weight"] = token_metric(gate.clamp(max=1.0), p.mask)
            metrics["loss/soft_gate_amplified_frac"] = token_metric((gate > 1).float(), p.mask)
        per_token = term.loss + regularizers(cfg, p, metrics)
        metrics.update(term.extra)
        if correction is not None:
            metrics.update(correction.metrics)
        loss = normalize(per_token, p.trained, p.sample_lens, cfg.normalization, scale)
        codes = None
        if outcomes:
            valid = full.mask if correction is None else correction.valid
            codes = token_outcomes(p, term, valid, None if correction is None else correction.rejected)
        return LossOutputs(loss=loss, metrics=metrics, outcomes=codes)


def sampler_ratio_metrics(full: TokenView, correction: Correction | None) -> dict[str, Tensor]:
    """The ratio to the sampler, r = exp(clamp(lp - lq, -B, B)), over the trained tokens with finite logprobs
    whatever the correction (the view's own ratio is against the correction's old policy, and rejected tokens are
    off its mask): `loss/importance_ratio`, `loss/mismatch_kl`, `loss/ratio_clamped_frac`,
    `loss/nonfinite_ratio_frac`."""
    if correction is None:
        valid, log_r, clamped = full.mask, full.log_r.detach(), full.clamped
    else:
        inputs = full.inputs
        valid = correction.valid
        raw = inputs.trainer_logprobs.detach() - inputs.inference_logprobs.to(inputs.trainer_logprobs.dtype)
        raw = torch.where(valid, raw, torch.zeros_like(raw))
        log_r, clamped = raw.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), valid & (raw.abs() > LOG_RATIO_BOUND)
    r = torch.exp(log_r)
    return {
        "loss/importance_ratio": token_metric(r, valid),
        "loss/mismatch_kl": token_metric(r - log_r - 1, valid),
        "loss/ratio_clamped_frac": token_metric(clamped.float(), valid),
        "loss/nonfinite_ratio_frac": token_metric((full.trained & ~valid).float(), full.trained),
    }


def build_loss(config: LossConfig | Mapping[str, Any]) -> Loss:
    """The loss of `config` (a config model or a dict): see `Loss`."""
    return Loss(config)


def compute_step_loss(config: LossConfig | Mapping[str, Any], micro_batches: Sequence[LossInputs],
                      max_tokens: int) -> LossOutputs:
    """Single-process step: the summed contributions of `micro_batches` and the step's mean metrics.

    The same scale as the trainer: denominators summed over the micro-batches and, for a loss that needs them,
    the step's statistics (a no-grad pre-pass, `Loss.step_statistics`).
    """
    loss_fn = build_loss(config)
    counts = sum((scale_counts(mb) for mb in micro_batches), torch.zeros(3, dtype=torch.long))
    scale = LossScale.from_counts(counts, max_tokens=max_tokens)
    if loss_fn.needs_step_pass:
        sums = sum((loss_fn.step_statistics(mb) for mb in micro_batches), torch.zeros(STEP_STATISTICS,
                                                                                         dtype=torch.float64))
        scale = loss_fn.with_step_statistics(scale, sums)
    outputs = [loss_fn(mb, scale) for mb in micro_batches]
    loss = torch.stack([o.loss for o in outputs]).sum()
    metrics = {k: torch.tensor(v) for k, v in reduce_metrics([o.metrics for o in outputs]).items()}
    return LossOutputs(loss=loss, metrics=metrics)

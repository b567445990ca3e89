"""The loss's data types: one packed micro-batch in (`LossInputs`), a loss and its metrics out
(`LossOutputs`), and the step's denominators (`LossScale`, from `scale_counts` of every micro-batch)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from prime_rl.trainer.rl.losses.segments import segment_sum


@dataclass
class LossInputs:
    """One packed micro-batch, flat over its T tokens."""

    trainer_logprobs: Tensor
    """[T] float, differentiable: log pi_theta of each token under the trainer."""
    inference_logprobs: Tensor
    """[T] float: log prob of each token under the policy that sampled it."""
    advantages: Tensor
    """[T] float: advantage of each token (usually the sample's advantage repeated)."""
    loss_mask: Tensor
    """[T] bool: true on the tokens that train (completion tokens)."""
    sample_lens: Tensor
    """[S] long: lengths of the packed samples, in order, summing to T."""
    ref_logprobs: Tensor | None = None
    """[T] float: reference-model logprobs (needed when kl_coef > 0)."""
    teacher_logprobs: Tensor | None = None
    """[T] float: teacher logprobs (needed when teacher_tau > 0)."""
    entropies: Tensor | None = None
    """[T] float, differentiable: entropy of the trainer's distribution at each token."""
    old_logprobs: Tensor | None = None
    """[T] float, no gradient: lo, the trainer's logprobs before the step's first update (needed by
    `[loss.correction] old_logprobs = "trainer"`)."""


@dataclass
class LossOutputs:
    """A loss and its metrics. From `build_loss`: metrics are `[sum, count]` pairs;
    from `compute_step_loss`: metrics are 0-dim tensors holding the step means."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    outcomes: Tensor | None = None
    """[T] int8, when asked for: what the loss did with each token, an index into `TOKEN_OUTCOMES`."""


@dataclass(frozen=True)
class LossScale:
    """The denominators (and step statistics) of one optimizer step, over ALL micro-batches on ALL ranks."""

    total_loss_tokens: int
    """Trained tokens (loss_mask true) in the step: the `token` denominator."""
    num_samples: int
    """Samples with at least one trained token in the step: N of `sequence` and `constant`. A sample
    whose tokens are all masked (a padding row, a truncated completion under `mask_truncated`)
    is not counted."""
    max_tokens: int
    """Completion budget L (max new tokens per sample), read by the `constant` normalization."""
    num_micro_batches: int = 1
    """M of `token_local`: micro-batches of the step over all ranks with at least one trained
    token (padding micro-batches, which only even out the ranks' counts, do not count)."""
    log_ratio_moments: tuple[float, float, float] | None = None
    """`[sum log r, sum (log r)^2, count]` over the step's trained tokens (`contract.log_ratio_moments_of`
    summed over micro-batches and ranks); read by variants with `needs_log_ratio_moments`
    (is_reshape). None: such a variant takes its own call's tokens as the whole step."""
    is_weight_mean: float | None = None
    """The step's mean behaviour importance weight (`[loss.correction] weight_batch_normalize`: the weights are
    divided by it), from the step pass (`Loss.step_statistics`). None: not normalized."""

    @classmethod
    def from_counts(cls, counts: Tensor | Sequence[float], max_tokens: int) -> LossScale:
        """From the (all-reduced) sum of `scale_counts` of every micro-batch of the step."""
        values = counts.tolist() if isinstance(counts, Tensor) else counts
        tokens, samples, micro_batches = (int(x) for x in values)
        return cls(
            total_loss_tokens=tokens, num_samples=samples, max_tokens=max_tokens, num_micro_batches=micro_batches
        )

    def with_log_ratio_moments(self, moments: Tensor | Sequence[float]) -> LossScale:
        """This scale carrying the step's (all-reduced) sum of `contract.log_ratio_moments_of`."""
        values = moments.tolist() if isinstance(moments, Tensor) else moments
        s1, s2, n = (float(x) for x in values)
        return dataclasses.replace(self, log_ratio_moments=(s1, s2, n))


def scale_counts(inputs: LossInputs) -> Tensor:
    """`[trained tokens, samples with a trained token, 1 if any token trains else 0]` of one
    micro-batch (long); sum over the step's micro-batches, all-reduce across ranks, then
    `LossScale.from_counts`. The one place these counts are defined (the trainer's `step_scale`
    calls it too): only `loss_mask` and `sample_lens` are read, so a batch file's `MicroBatch`
    can be passed as it is."""
    per_sample = segment_sum(inputs.loss_mask.long(), inputs.sample_lens)
    tokens = per_sample.sum()
    return torch.stack([tokens, (per_sample > 0).sum(), (tokens > 0).long()]).cpu()

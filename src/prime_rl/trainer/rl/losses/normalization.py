"""How per-token losses become one micro-batch's share of the step loss (docs/losses.md#normalization)."""

from __future__ import annotations

from torch import Tensor

from prime_rl.trainer.rl.losses.inputs import LossScale
from prime_rl.trainer.rl.losses.segments import segment_sum


def normalize(per_token: Tensor, trained: Tensor, sample_lens: Tensor, normalization: str, scale: LossScale) -> Tensor:
    """This micro-batch's share of the step loss under `normalization` (docs/losses.md#normalization); `trained`
    is the loss_mask, the tokens the step's denominators count."""
    if normalization == "token":
        return per_token.sum() / max(scale.total_loss_tokens, 1)
    if normalization == "sequence":
        tokens = segment_sum(trained.to(per_token.dtype), sample_lens)
        return (segment_sum(per_token, sample_lens) / tokens.clamp(min=1)).sum() / max(scale.num_samples, 1)
    if normalization == "token_local":
        return per_token.sum() / trained.sum().clamp(min=1) / max(scale.num_micro_batches, 1)
    if normalization == "constant":
        return per_token.sum() / max(scale.num_samples * scale.max_tokens, 1)
    raise ValueError(f"unknown normalization {normalization!r}")

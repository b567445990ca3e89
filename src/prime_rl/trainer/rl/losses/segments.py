"""Per-sample reductions over a packed micro-batch, flat over its T tokens (no Python loop over samples)."""

from __future__ import annotations

import torch
from torch import Tensor


def sample_index(sample_lens: Tensor) -> Tensor:
    """[T] long: the sample each token belongs to."""
    return torch.repeat_interleave(torch.arange(len(sample_lens), device=sample_lens.device), sample_lens)


def segment_sum(values: Tensor, sample_lens: Tensor) -> Tensor:
    """[S]: sum of `values` [T] within each sample (differentiable)."""
    index = sample_index(sample_lens.to(values.device))
    return values.new_zeros(len(sample_lens)).index_add(0, index, values)


def segment_masked_mean(values: Tensor, mask: Tensor, sample_lens: Tensor) -> Tensor:
    """[S]: mean of `values` over each sample's masked tokens (0 for a sample without any)."""
    total = segment_sum(torch.where(mask, values, torch.zeros_like(values)), sample_lens)
    count = segment_sum(mask.to(values.dtype), sample_lens)
    return total / count.clamp(min=1)


def broadcast_to_tokens(per_sample: Tensor, sample_lens: Tensor) -> Tensor:
    """[T]: each sample's value repeated over its tokens."""
    return torch.repeat_interleave(per_sample, sample_lens.to(per_sample.device))


def segment_any(flags: Tensor, sample_lens: Tensor) -> Tensor:
    """[S] bool: whether any token of each sample is flagged."""
    return segment_sum(flags.float(), sample_lens) > 0


def reverse_discounted_sum(values: Tensor, mask: Tensor, sample_lens: Tensor, gamma: float, block: int = 128) -> Tensor:
    """[T]: sum_{k >= t} gamma^(k - t) values_k over each sample's masked tokens, where k - t counts
    masked tokens (unmasked tokens neither contribute nor add decay). 0 on unmasked tokens.

    Vectorized: tokens go to a padded [S, P] grid by their rank among the sample's masked tokens;
    each block of `block` columns is one matmul with the decay matrix gamma^(k-t), and a loop over
    blocks (P / block steps, not samples) carries the discounted tail from right to left.
    """
    index = sample_index(sample_lens.to(values.device))
    mask_f = mask.to(values.dtype)
    counts = segment_sum(mask_f, sample_lens).long()
    ranks = torch.cumsum(mask.long(), 0) - 1
    starts = torch.cumsum(counts, 0) - counts  # masked tokens before each sample
    pos = ranks - starts[index]
    num_samples = len(sample_lens)
    width = max(int(counts.max()) if num_samples else 0, 1)
    num_blocks = -(-width // block)
    grid = values.new_zeros(num_samples, num_blocks * block)
    rows, cols = index[mask], pos[mask]
    grid = grid.index_put((rows, cols), values[mask])
    steps = torch.arange(block, device=values.device, dtype=values.dtype)
    diff = steps[None, :] - steps[:, None]  # k - t
    decay = torch.where(diff >= 0, gamma ** diff.clamp(min=0), torch.zeros_like(diff))  # [t, k]
    tail_decay = gamma ** (block - steps)  # gamma^(first column of next block - t)
    out_blocks = []
    carry = values.new_zeros(num_samples)  # discounted sum starting at the next block's first column
    for b in range(num_blocks - 1, -1, -1):
        chunk = grid[:, b * block : (b + 1) * block]
        out = chunk @ decay.T + carry[:, None] * tail_decay[None, :]
        out_blocks.append(out)
        carry = out[:, 0]
    full = torch.cat(out_blocks[::-1], dim=1)
    result = values.new_zeros(values.shape)
    return result.index_put((mask.nonzero(as_tuple=True)[0],), full[rows, cols])


def segment_max(values: Tensor, mask: Tensor, sample_lens: Tensor) -> Tensor:
    """[S]: the max of `values` over each sample's masked tokens (0 for a sample without any)."""
    filled = torch.where(mask, values, torch.full_like(values, -torch.inf))
    top = torch.full((len(sample_lens),), -torch.inf, dtype=values.dtype, device=values.device)
    top = top.scatter_reduce(0, sample_index(sample_lens.to(values.device)), filled, reduce="amax")
    return torch.where(top == -torch.inf, torch.zeros_like(top), top)

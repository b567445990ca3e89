"""Metric pairs, the form in which trainer metrics cross micro-batches and ranks exactly: `[sum, count]`, whose
mean is sum / count, or, for a key ending in `MAX_SUFFIX`, `[max, count]`, whose value is the max (count 0: none)."""

from __future__ import annotations

import torch
from torch import Tensor

MAX_SUFFIX = "_max"


def is_max_key(key: str) -> bool:
    return key.endswith(MAX_SUFFIX)


def combine(key: str, a: Tensor, b: Tensor) -> Tensor:
    """Two pairs of `key` as one: sums and counts added, or (a max key) the larger value and the counts added."""
    if is_max_key(key):
        return torch.stack([torch.maximum(a[0], b[0]), a[1] + b[1]])
    return a + b


def value(key: str, pair: Tensor | list[float]) -> float | None:
    """The metric a combined pair stands for; None when it counted nothing."""
    s, c = (float(x) for x in pair)
    if c <= 0:
        return None
    return s if is_max_key(key) else s / c

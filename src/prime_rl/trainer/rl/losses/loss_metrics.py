"""Loss metrics as float64 `[sum, count]` pairs (`[max, count]` for a key ending in `_max`,
`utils.metric_pairs`): exact when combined over micro-batches and ranks (`reduce_metrics` divides at the end)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from prime_rl.utils.metric_pairs import combine, value


def token_metric(values: Tensor, mask: Tensor) -> Tensor:
    """`[sum over masked tokens, count]` in float64, detached."""
    values = values.detach().to(torch.float64)
    return torch.stack([torch.where(mask, values, torch.zeros_like(values)).sum(), mask.sum().to(torch.float64)])


def scalar_metric(value: Tensor | float) -> Tensor:
    """`[value, 1]`: a per-call scalar, averaged over calls by `reduce_metrics`."""
    return torch.tensor([float(value), 1.0], dtype=torch.float64)


def max_metric(values: Tensor, mask: Tensor) -> Tensor:
    """`[max over masked tokens, count]` in float64, detached (-inf and 0 when none): its key must end in `_max`."""
    values = values.detach().to(torch.float64)
    top = torch.where(mask, values, torch.full_like(values, -torch.inf)).max() if values.numel() else values.new_tensor(
        -torch.inf)
    return torch.stack([top, mask.sum().to(torch.float64)])


def derived_metrics(means: dict[str, float]) -> dict[str, float]:
    """Metrics computed from others after the reduction: the importance weight's effective sample size
    ESS = mean(w)^2 / mean(w^2) (verl's rollout_is_eff_sample_size), a fraction of the tokens in (0, 1]."""
    out = {}
    if means.get("correction/is_weight_sq", 0.0) > 0 and "correction/is_weight" in means:
        out["correction/is_weight_ess"] = means["correction/is_weight"] ** 2 / means["correction/is_weight_sq"]
    return out


def reduce_metrics(metric_dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, float]:
    """Combine the pairs of several micro-batches (or already all-reduced pairs) and return each metric's value,
    the derived ones added (`derived_metrics`); a metric that counted nothing is left out."""
    totals: dict[str, Tensor] = {}
    for metrics in metric_dicts:
        for key, pair in metrics.items():
            pair = pair.detach().to("cpu", torch.float64)
            totals[key] = combine(key, totals[key], pair) if key in totals else pair
    means = {key: v for key, pair in totals.items() if (v := value(key, pair)) is not None}
    return means | derived_metrics(means)

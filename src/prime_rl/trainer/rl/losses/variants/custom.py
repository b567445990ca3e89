"""`custom`: a user's function, imported by path, under either contract."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from prime_rl.configs.loss import LOSSES, CustomLossConfig
from prime_rl.trainer.rl.losses.contract import PolicyTerm, TokenView
from prime_rl.trainer.rl.losses.loss_metrics import token_metric
from prime_rl.utils.errors import ConfigError
from prime_rl.utils.imports import import_callable
from prime_rl.utils.metric_pairs import MAX_SUFFIX, is_max_key


@LOSSES.implements(CustomLossConfig)
def custom_loss(cfg: CustomLossConfig, p: TokenView) -> PolicyTerm:
    """User function, imported by path, under the one variant contract `fn(view: TokenView, **kwargs) -> PolicyTerm`
    (`contract = "view"`: its gate and clip flags reported like the built-ins'); `contract = "inputs"`, the older
    contract, is adapted onto it (`inputs_contract_as_view`)."""
    fn = import_callable(cfg.import_path)
    variant = fn if cfg.contract == "view" else inputs_contract_as_view(fn, cfg)
    term = variant(p, **cfg.kwargs)
    if not isinstance(term, PolicyTerm):
        raise TypeError(f"custom loss {cfg.import_path} (contract 'view') returned {type(term).__name__}, "
                        "expected a PolicyTerm")
    return term


def inputs_contract_as_view(fn: Callable[..., Any], cfg: CustomLossConfig) -> Callable[..., PolicyTerm]:
    """`fn(inputs: LossInputs, **kwargs)` as a view-contract variant. `fn` returns per-token losses [T], a summed
    loss (0-dim), or `(loss, metrics)` with per-token metric tensors [T] (logged as `loss/<name>`, averaged over
    trained tokens). `fn` sees the inputs with `loss_mask` narrowed to the view's tokens (finite logprobs, kept by
    the correction), `inference_logprobs` the sampler's and `old_logprobs` the trainer's pi_old where there is one;
    the adapter masks its losses to the view's tokens and reports no gate or clip flags; the framework normalizes."""

    def variant(p: TokenView, **kwargs: Any) -> PolicyTerm:
        result = fn(replace(p.inputs, loss_mask=p.mask), **kwargs)
        user_metrics: dict[str, Tensor] = {}
        if isinstance(result, tuple):
            result, user_metrics = result
        if not isinstance(result, Tensor):
            raise TypeError(f"custom loss {cfg.import_path} returned {type(result).__name__}, expected a Tensor")
        if result.dim() == 0:
            loss = _summed_on_first_token(result, p, cfg)
        elif result.shape == p.lp.shape:
            loss = p.off_mask_zero(result)
        else:
            raise TypeError(f"custom loss {cfg.import_path} returned shape {tuple(result.shape)}, expected [] or "
                            f"{tuple(p.lp.shape)}")
        if any(is_max_key(name) for name in user_metrics):
            raise TypeError(f"custom loss {cfg.import_path}: metric names ending in {MAX_SUFFIX!r} are kept for "
                            "metrics reduced by their maximum; rename them")
        extra = {f"loss/{name.removeprefix('loss/')}": token_metric(value, p.mask)
                 for name, value in user_metrics.items()}
        none = torch.zeros_like(p.mask)
        return PolicyTerm(loss, torch.zeros_like(p.r), none, none, extra)

    return variant


def _summed_on_first_token(result: Tensor, p: TokenView, cfg: CustomLossConfig) -> Tensor:
    """A summed loss on the first token, so the normalizations divide it like a token sum; refused where per-token
    losses are needed."""
    if cfg.normalization == "sequence":
        raise ConfigError(
            f"custom loss {cfg.import_path} returned a summed loss; 'sequence' normalization needs per-token losses"
        )
    if cfg.correction.weight != "none" or cfg.correction.reject:
        raise ConfigError(f"custom loss {cfg.import_path} returned a summed loss; [loss.correction] weights or "
                          "rejects single tokens and needs per-token losses")
    return torch.zeros_like(p.lp).index_put((torch.tensor([0], device=p.lp.device),), result.reshape(1))

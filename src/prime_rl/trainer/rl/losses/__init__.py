"""Every policy loss of prime-rl, written to be read next to its paper.

The math is defined once, in docs/losses.md: notation, the normalizations ("Normalization"), what an
extreme or infinite ratio does ("Robustness": `log r` clamped to +-`LOG_RATIO_BOUND` before any exp,
tokens with an infinite ratio dropped), every variant, the correction stage ("Rollout correction") and every metric
("Metrics", docs/metrics.md). This package implements it, one module per concern:

- `inputs`: the data types (`LossInputs` in, `LossOutputs` out, the step's `LossScale`);
- `segments`: per-sample reductions over a packed micro-batch;
- `contract`: `token_view(inputs)`, one micro-batch as the `TokenView` a variant reads (tokens outside the loss mask set
  to log r = 0 and A = 0 before any math), and the `PolicyTerm` it returns;
- `variants/`: one module per family, each `fn(cfg, view: TokenView) -> PolicyTerm` registered with
  `@LOSSES.implements(ItsConfig)` (docs/losses.md "Writing a variant: the contract"; a custom loss may use the same
  contract, or the older `inputs` one, adapted onto it by `variants/custom.py`);
- `correction`: the `[loss.correction]` stage every variant accepts (the old policy the surrogate's ratio is taken
  against, a truncated or IcePop importance weight, rejection rules, their metrics);
- `regularizers`, `normalization`, `loss_metrics`: what every variant shares.

How a loss is chosen from `[loss]` and applied to a micro-batch is `prime_rl.trainer.rl.loss` (`build_loss`), beside
this package: the one module the trainer imports a loss from.
"""

from prime_rl.trainer.rl.losses import variants  # noqa: F401  (registers the built-in variants)
from prime_rl.trainer.rl.losses.contract import (
    LOG_RATIO_BOUND,
    TOKEN_OUTCOMES,
    PolicyTerm,
    TokenView,
    token_outcomes,
    token_view,
)
from prime_rl.trainer.rl.losses.inputs import LossInputs, LossOutputs, LossScale, scale_counts
from prime_rl.trainer.rl.losses.loss_metrics import reduce_metrics, scalar_metric, token_metric
from prime_rl.trainer.rl.losses.normalization import normalize
from prime_rl.trainer.rl.losses.regularizers import kl_estimate
from prime_rl.trainer.rl.losses.segments import (
    broadcast_to_tokens,
    reverse_discounted_sum,
    sample_index,
    segment_any,
    segment_masked_mean,
    segment_sum,
)
from prime_rl.trainer.rl.losses.variants.aipo import default_loss, sapo_loss
from prime_rl.trainer.rl.losses.variants.cispo import cispo_loss
from prime_rl.trainer.rl.losses.variants.dppo import dppo_loss
from prime_rl.trainer.rl.losses.variants.gspo import gspo_loss
from prime_rl.trainer.rl.losses.variants.is_reshape import is_reshape_loss
from prime_rl.trainer.rl.losses.variants.ppo import fipo_loss, ppo_clip_loss, vanilla_loss

__all__ = [
    "LOG_RATIO_BOUND", "TOKEN_OUTCOMES", "LossInputs", "LossOutputs", "LossScale", "PolicyTerm", "TokenView",
    "broadcast_to_tokens", "cispo_loss", "default_loss", "dppo_loss", "fipo_loss",
    "gspo_loss", "is_reshape_loss", "kl_estimate", "normalize",
    "ppo_clip_loss", "reduce_metrics", "reverse_discounted_sum", "sample_index", "sapo_loss", "scalar_metric",
    "scale_counts", "segment_any", "segment_masked_mean", "segment_sum", "token_metric", "token_outcomes", "token_view",
    "vanilla_loss",
]

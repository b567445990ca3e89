"""What every variant reads and returns: `token_view(inputs)` -> `TokenView` (masked, NaN-safe tensors), and the
`PolicyTerm` a variant returns (docs/losses.md, "Writing a variant: the contract")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from prime_rl.trainer.rl.losses.inputs import LossInputs, LossScale

LOG_RATIO_BOUND = 20.0
"""B, the bound log r is clamped to before any exp (docs/losses.md#robustness): finite in float32 with room
for sums over many tokens; the same bound as low_var_kl's clamp of d. Exact for |log r| <= B."""


@dataclass
class TokenView:
    """What every policy-loss variant reads (`token_view(inputs, scale)`): one micro-batch's tensors [T], masked
    and NaN-safe. Everything is 0 (log r) / 1 (r) off `mask`, so a variant computes on all T tokens without
    indexing and garbage off the mask never reaches its math. The public contract of a variant, built-in or
    custom (`[loss] type = "custom"`, `contract = "view"`): `fn(cfg, view) -> PolicyTerm` (docs/losses.md).
    `inputs` keeps the raw `LossInputs` (the sampler's logprobs, reference and teacher logprobs, entropies). The
    ratio is taken against the old policy `old`: the sampler's logprobs lq unless `[loss.correction]` names another
    (docs/losses.md#rollout-correction)."""

    lp: Tensor  # trainer logprobs, 0 off the mask (differentiable)
    log_r: Tensor  # clamp(lp - old, -B, B), 0 off the mask (differentiable inside the bound)
    r: Tensor  # exp(log_r)
    adv: Tensor  # A, 0 off the mask
    mask: Tensor  # trained tokens whose lp and old are not -inf (and the correction kept): what every variant sees
    trained: Tensor  # loss_mask: the tokens the normalization counts
    clamped: Tensor  # [T] bool: mask and |lp - old| > B
    sample_lens: Tensor
    inputs: LossInputs
    log_ratio_moments: tuple[float, float, float] | None = None  # the step's, from LossScale
    old: Tensor | None = None  # the old policy's logprobs the ratio is taken against, 0 off the mask (no gradient)

    def off_mask_zero(self, values: Tensor) -> Tensor:
        return torch.where(self.mask, values, torch.zeros_like(values))


def token_view(inputs: LossInputs, scale: LossScale | None = None, old: Tensor | None = None) -> TokenView:
    """`inputs` as a variant reads them, the ratio against `old` (default: the sampler's `inference_logprobs`)."""
    trained = inputs.loss_mask.bool()
    lp_raw = inputs.trainer_logprobs
    lq_raw = (inputs.inference_logprobs if old is None else old).to(lp_raw.dtype).detach()
    # Probability 0 on either side: an infinite ratio, dropped (see the module docstring).
    mask = trained & (lp_raw != -math.inf) & (lq_raw != -math.inf)
    zero = torch.zeros_like(lp_raw)
    lp = torch.where(mask, lp_raw, zero)
    old_lp = torch.where(mask, lq_raw, zero.detach())
    raw_log_r = lp - old_lp
    log_r = raw_log_r.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    adv = torch.where(mask, inputs.advantages.to(lp_raw.dtype), zero.detach())
    return TokenView(
        lp=lp,
        log_r=log_r,
        r=torch.exp(log_r),
        adv=adv,
        mask=mask,
        trained=trained,
        clamped=mask & (raw_log_r.detach().abs() > LOG_RATIO_BOUND),
        sample_lens=inputs.sample_lens.to(lp_raw.device),
        inputs=inputs,
        log_ratio_moments=None if scale is None else scale.log_ratio_moments,
        old=old_lp,
    )


def log_ratio_moments_of(p: TokenView) -> Tensor:
    """float64 `[sum log r, sum (log r)^2, count]` over `p`'s tokens, no gradient (is_reshape's step statistic)."""
    log_r = p.log_r.detach()[p.mask].to(torch.float64)
    return torch.stack([log_r.sum(), (log_r**2).sum(), log_r.new_tensor(float(log_r.numel()))])


@dataclass
class PolicyTerm:
    """What a variant returns: its per-token policy loss l_t (before normalization, which the framework applies
    with the regularizers) and what the shared metrics need (docs/losses.md, "Writing a variant")."""

    loss: Tensor  # [T] per-token loss (0 off the mask)
    gate: Tensor  # [T] soft_gate_weight per token (detached)
    clip_low: Tensor  # [T] bool
    clip_high: Tensor  # [T] bool
    extra: dict[str, Tensor] = field(default_factory=dict)  # extra [sum, count] metrics
    through_ratio: bool = True
    """The gradient reaches lp only through log r (every built-in variant but cispo and gspo_token, whose gradient
    reaches lp directly): where the clamp holds log r constant (`TokenView.clamped`) the gradient is 0, and so is
    the reported gate."""


TOKEN_OUTCOMES = "-klhxr"
"""What the loss did with a token, one character each (`Loss(inputs, scale, outcomes=True)`, the viewer's mask
colouring): '-' outside the loss mask (a prompt's, an environment's or a masked sample's token: trains nothing),
'k' kept (its gradient flows as the variant weights it), 'l' / 'h' the variant's low / high bound acted on it
(`PolicyTerm.clip_low` / `clip_high`: masked by `default`, clipped by the PPO family, truncated by cispo; docs/losses.md
per variant), 'x' trained but its ratio is not finite (a -inf logprob: dropped before any math), 'r' rejected by a
rule of `[loss.correction]` (trains nothing, still counted in the denominators)."""


def token_outcomes(p: TokenView, term: PolicyTerm, valid: Tensor | None = None,
                   rejected: Tensor | None = None) -> Tensor:
    """[T] int8 indices into `TOKEN_OUTCOMES` (a token past both bounds, as `default`'s sequence masks can make one,
    reads 'h'); `valid`: the trained tokens with finite logprobs (default `p.mask`), `rejected`: those the correction
    stage removed or weighted by 0."""
    valid = p.mask if valid is None else valid
    codes = torch.zeros_like(p.trained, dtype=torch.int8)
    codes = codes.masked_fill(p.mask, 1).masked_fill(term.clip_low & p.mask, 2).masked_fill(term.clip_high & p.mask, 3)
    if rejected is not None:
        codes = codes.masked_fill(rejected, 5)
    return codes.masked_fill(p.trained & ~valid, 4)


def safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0 where den is 0 (a gate on an r that underflowed)."""
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))

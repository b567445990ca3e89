"""Every policy loss of prime-rl, written to be read next to its paper.

The math is defined once, in docs/losses.md: notation, the normalizations ("Normalization"), what an
extreme or infinite ratio does ("Robustness": `log r` clamped to +-`LOG_RATIO_BOUND` before any exp,
tokens with an infinite ratio dropped), every variant and every metric ("Metrics", docs/metrics.md).
This module implements it, and its docstrings point to the section of each formula instead of restating it:

- `token_view(inputs)`: one packed micro-batch (`LossInputs`, flat over its T tokens) as the `TokenView`
  a variant reads, tokens outside the loss mask set to log r = 0 and A = 0 before any math;
- the variants, `fn(cfg, view: TokenView) -> PolicyTerm` each (per-token loss, gate, clip flags and
  its own metrics), registered with `@LOSSES.implements(ItsConfig)` (docs/losses.md "Writing a
  variant: the contract"; a custom loss may use the same contract);
- `build_loss(config)(inputs, scale)`: one micro-batch's contribution, already divided by the step's
  denominators in `LossScale`, so the step loss is the plain sum over micro-batches and ranks;
- metrics as float64 `[sum, count]` pairs (`reduce_metrics`), exact across micro-batches and ranks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import TypeAdapter
from torch import Tensor

from prime_rl.configs.loss import (
    LOSSES,
    BnpoLossConfig,
    CispoLossConfig,
    CustomLossConfig,
    DapoLossConfig,
    DefaultLossConfig,
    DppoLossConfig,
    DrGrpoLossConfig,
    FipoLossConfig,
    GrpoLossConfig,
    GspoLossConfig,
    GspoTokenLossConfig,
    IsReshapeLossConfig,
    LossConfig,
    PPOClipConfig,
    SapoLossConfig,
    VanillaLossConfig,
)
from prime_rl.utils.errors import ConfigError
from prime_rl.utils.imports import import_callable

# --------------------------------------------------------------------------------------
# Public data types
# --------------------------------------------------------------------------------------


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


@dataclass
class LossOutputs:
    """A loss and its metrics. From `build_loss`: metrics are `[sum, count]` pairs;
    from `compute_step_loss`: metrics are 0-dim tensors holding the step means."""

    loss: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    outcomes: Tensor | None = None
    """[T] int8, when asked for: what the loss did with each token, an index into `TOKEN_OUTCOMES`."""


TOKEN_OUTCOMES = "-klhx"
"""What the loss did with a token, one character each (`Loss(inputs, scale, outcomes=True)`, the viewer's mask
colouring): '-' outside the loss mask (a prompt's, an environment's or a masked sample's token: trains nothing),
'k' kept (its gradient flows as the variant weights it), 'l' / 'h' the variant's low / high bound acted on it
(`PolicyTerm.clip_low` / `clip_high`: masked by `default`, clipped by the PPO family, truncated by cispo; docs/losses.md
per variant), 'x' trained but its ratio is not finite (a -inf logprob: dropped before any math)."""


def token_outcomes(p: TokenView, term: PolicyTerm) -> Tensor:
    """[T] int8 indices into `TOKEN_OUTCOMES` (a token past both bounds, as `default`'s sequence masks can make one,
    reads 'h')."""
    codes = torch.zeros_like(p.trained, dtype=torch.int8)
    codes = codes.masked_fill(p.mask, 1).masked_fill(term.clip_low & p.mask, 2).masked_fill(term.clip_high & p.mask, 3)
    return codes.masked_fill(p.trained & ~p.mask, 4)


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
    """`[sum log r, sum (log r)^2, count]` over the step's trained tokens (`log_ratio_moments`
    summed over micro-batches and ranks); read by variants with `needs_log_ratio_moments`
    (is_reshape). None: such a variant takes its own call's tokens as the whole step."""

    @classmethod
    def from_counts(cls, counts: Tensor | Sequence[float], max_tokens: int) -> LossScale:
        """From the (all-reduced) sum of `scale_counts` of every micro-batch of the step."""
        values = counts.tolist() if isinstance(counts, Tensor) else counts
        tokens, samples, micro_batches = (int(x) for x in values)
        return cls(
            total_loss_tokens=tokens, num_samples=samples, max_tokens=max_tokens, num_micro_batches=micro_batches
        )

    def with_log_ratio_moments(self, moments: Tensor | Sequence[float]) -> LossScale:
        """This scale carrying the step's (all-reduced) sum of `log_ratio_moments`."""
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


def log_ratio_moments(inputs: LossInputs) -> Tensor:
    """float64 `[sum log r, sum (log r)^2, count]` over one micro-batch's trained tokens, with
    log r exactly as the loss sees it (clamped to +-LOG_RATIO_BOUND; tokens with an infinite
    logprob left out); no gradient. Sum over the step's micro-batches, all-reduce across ranks,
    then `LossScale.with_log_ratio_moments`."""
    with torch.no_grad():
        return _moments(token_view(inputs)).cpu()


# --------------------------------------------------------------------------------------
# Per-sample reductions (no Python loop over samples)
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------


def _metric(values: Tensor, mask: Tensor) -> Tensor:
    """`[sum over masked tokens, count]` in float64, detached."""
    values = values.detach().to(torch.float64)
    return torch.stack([torch.where(mask, values, torch.zeros_like(values)).sum(), mask.sum().to(torch.float64)])


def _scalar_metric(value: Tensor | float) -> Tensor:
    """`[value, 1]`: a per-call scalar, averaged over calls by `reduce_metrics`."""
    return torch.tensor([float(value), 1.0], dtype=torch.float64)


def reduce_metrics(metric_dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, float]:
    """Sum the `[sum, count]` pairs of several micro-batches (or already all-reduced pairs) and
    return each metric's mean; a metric with count 0 is left out."""
    totals: dict[str, Tensor] = {}
    for metrics in metric_dicts:
        for key, pair in metrics.items():
            pair = pair.detach().to("cpu", torch.float64)
            totals[key] = totals[key] + pair if key in totals else pair
    return {key: float(s / c) for key, (s, c) in ((k, v.tolist()) for k, v in totals.items()) if c > 0}


# --------------------------------------------------------------------------------------
# The shared preparation of one call
# --------------------------------------------------------------------------------------


LOG_RATIO_BOUND = 20.0
"""B, the bound log r is clamped to before any exp (docs/losses.md#robustness): finite in float32 with room
for sums over many tokens; the same bound as low_var_kl's clamp of d. Exact for |log r| <= B."""


@dataclass
class TokenView:
    """What every policy-loss variant reads (`token_view(inputs, scale)`): one micro-batch's tensors [T], masked
    and NaN-safe. Everything is 0 (log r) / 1 (r) off `mask`, so a variant computes on all T tokens without
    indexing and garbage off the mask never reaches its math. The public contract of a variant, built-in or
    custom (`[loss] type = "custom"`, `contract = "view"`): `fn(cfg, view) -> PolicyTerm` (docs/losses.md).
    `inputs` keeps the raw `LossInputs` (reference and teacher logprobs, entropies)."""

    lp: Tensor  # trainer logprobs, 0 off the mask (differentiable)
    log_r: Tensor  # clamp(lp - lq, -B, B), 0 off the mask (differentiable inside the bound)
    r: Tensor  # exp(log_r)
    adv: Tensor  # A, 0 off the mask
    mask: Tensor  # trained tokens whose lp and lq are not -inf: the tokens every variant sees
    trained: Tensor  # loss_mask: the tokens the normalization counts
    clamped: Tensor  # [T] bool: mask and |lp - lq| > B
    sample_lens: Tensor
    inputs: LossInputs
    log_ratio_moments: tuple[float, float, float] | None = None  # the step's, from LossScale

    def off_mask_zero(self, values: Tensor) -> Tensor:
        return torch.where(self.mask, values, torch.zeros_like(values))


def token_view(inputs: LossInputs, scale: LossScale | None = None) -> TokenView:
    trained = inputs.loss_mask.bool()
    lp_raw = inputs.trainer_logprobs
    lq_raw = inputs.inference_logprobs.to(lp_raw.dtype)
    # Probability 0 on either side: an infinite ratio, dropped (see the module docstring).
    mask = trained & (lp_raw != -math.inf) & (lq_raw != -math.inf)
    zero = torch.zeros_like(lp_raw)
    lp = torch.where(mask, lp_raw, zero)
    raw_log_r = lp - torch.where(mask, lq_raw, zero.detach())
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
    )


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


def _shaped_advantage(cfg: Any, p: TokenView) -> Tensor:
    """The shaped advantage Â of `default` and `sapo`, detached, 0 off the mask
    (docs/losses.md#default--masked-importance-sampling-aipo-prime-rls-default)."""
    adv = cfg.adv_tau * p.adv
    if cfg.teacher_tau > 0:
        if p.inputs.teacher_logprobs is None:
            raise ConfigError("loss.teacher_tau > 0 but the batch has no teacher_logprobs")
        teacher = p.off_mask_zero(p.inputs.teacher_logprobs.to(p.lp.dtype))
        adv = adv + cfg.teacher_tau * (teacher - p.lp).detach()
    if cfg.kl_tau > 0:
        adv = adv - cfg.kl_tau * p.log_r.detach()
    return p.off_mask_zero(adv.detach())


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den with 0 where den is 0 (a gate on an r that underflowed)."""
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(num))


# --------------------------------------------------------------------------------------
# Variants: each returns the per-token policy loss l_t (before normalization)
# --------------------------------------------------------------------------------------


@LOSSES.implements(DefaultLossConfig)
def default_loss(cfg: DefaultLossConfig, p: TokenView) -> PolicyTerm:
    """AIPO / masked importance sampling: the REINFORCE gradient of the kept tokens with a stop-gradient
    importance weight (the token's ratio, or the sample's capped sequence ratio); a token or a whole sample outside
    its bounds is masked, not capped (docs/losses.md#default--masked-importance-sampling-aipo-prime-rls-default)."""
    r, lens = p.r.detach(), p.sample_lens
    log_r = p.log_r.detach()
    tok_low = p.mask & (r < cfg.token_mask_low)
    tok_high = p.mask & (r > cfg.token_mask_high)
    geo = torch.exp(segment_masked_mean(log_r, p.mask, lens))
    seq_low = (geo < cfg.geo_mask_low) | segment_any(p.mask & (r < cfg.sequence_mask_low), lens)
    seq_high = (geo > cfg.geo_mask_high) | segment_any(p.mask & (r > cfg.sequence_mask_high), lens)
    seq_low_t = broadcast_to_tokens(seq_low, lens) & p.mask
    seq_high_t = broadcast_to_tokens(seq_high, lens) & p.mask
    # Direction of a removed gradient: the token's own bound first, then the sample's.
    clip_low = tok_low | (seq_low_t & ~tok_high)
    clip_high = (tok_high | seq_high_t) & ~clip_low
    keep = p.mask & ~clip_low & ~clip_high
    if cfg.ratio_type == "sequence":
        log_seq = segment_sum(log_r, lens).clamp(max=10.0)
        weight = broadcast_to_tokens(torch.exp(log_seq).clamp(max=cfg.sequence_clip_high), lens)
    else:
        weight = r
    coef = torch.where(keep, weight * _shaped_advantage(cfg, p), torch.zeros_like(r))
    loss = -coef.detach() * p.lp
    gate = torch.where(keep, _safe_div(weight, r), torch.zeros_like(r))
    extra = {"loss/sequence_masked_frac": _metric((seq_low_t | seq_high_t).float(), p.mask)}
    return PolicyTerm(loss, gate, clip_low, clip_high, extra)


@LOSSES.implements(SapoLossConfig)
def sapo_loss(cfg: SapoLossConfig, p: TokenView) -> PolicyTerm:
    """SAPO: a sigmoid gate of r instead of a hard clip, differentiable through r itself, its temperature
    tau_pos or tau_neg by the sign of Â; the reported gate is its gradient weight
    (docs/losses.md#sapo--soft-adaptive-policy-optimization-arxiv-251120347)."""
    adv = _shaped_advantage(cfg, p)
    tau = torch.where(adv > 0, torch.full_like(adv, cfg.tau_pos), torch.full_like(adv, cfg.tau_neg))
    gate_p = torch.sigmoid(tau * (p.r - 1))
    loss = p.off_mask_zero(-(4 / tau) * gate_p * adv)
    pd = gate_p.detach()
    gate = p.off_mask_zero(4 * pd * (1 - pd))
    none = torch.zeros_like(p.mask)
    return PolicyTerm(loss, gate, none, none)


@LOSSES.implements(CispoLossConfig)
def cispo_loss(cfg: CispoLossConfig, p: TokenView) -> PolicyTerm:
    """CISPO: every token's policy gradient with a clipped, stop-gradient importance weight (no lower bound
    when eps_low is None), so every token keeps a gradient
    (docs/losses.md#cispo--clipped-is-weight-policy-optimization-minimax-m1-arxiv-250613585)."""
    r = p.r.detach()
    low = None if cfg.eps_low is None else 1 - cfg.eps_low
    clipped = r.clamp(min=low, max=1 + cfg.eps_high)
    loss = -(clipped * p.adv).detach() * p.lp
    clip_low = p.mask & (r < low) if low is not None else torch.zeros_like(p.mask)
    clip_high = p.mask & (r > 1 + cfg.eps_high)
    gate = p.off_mask_zero(_safe_div(clipped, r))
    return PolicyTerm(loss, gate, clip_low, clip_high, through_ratio=False)


@LOSSES.implements(DppoLossConfig)
def dppo_loss(cfg: DppoLossConfig, p: TokenView) -> PolicyTerm:
    """Upstream prime-rl's default: the importance-sampled policy gradient on the tokens inside DPPO's trust region
    (judged by the advantage's sign on the probability difference), plus kl_tau * (log r)^2 on every token
    (docs/losses.md#dppo--upstream-prime-rls-default)."""
    lq = p.off_mask_zero(p.inputs.inference_logprobs.to(p.lp.dtype))
    diff = (torch.exp(p.lp) - torch.exp(lq)).detach()
    rose, fell = diff > cfg.mask_high, diff < -cfg.mask_low
    up = p.adv > 0
    keep = p.mask & ~torch.where(up, rose, fell)
    loss = -torch.where(keep, cfg.adv_tau * p.adv * p.r, torch.zeros_like(p.r)) + cfg.kl_tau * p.log_r.square()
    clip_high, clip_low = p.mask & up & rose, p.mask & (p.adv < 0) & fell
    # The gate: -d l_t / d lp_t over r_t A_t, the KL term's pull included (0 where A = 0).
    r, log_r = p.r.detach(), p.log_r.detach()
    pull = torch.where(keep, cfg.adv_tau * p.adv * r, torch.zeros_like(r)) - 2 * cfg.kl_tau * log_r
    gate = p.off_mask_zero(_safe_div(pull, r * p.adv.abs()) * p.adv.sign())
    return PolicyTerm(p.off_mask_zero(loss), gate, clip_low, clip_high)


@LOSSES.implements(VanillaLossConfig)
def vanilla_loss(cfg: VanillaLossConfig, p: TokenView) -> PolicyTerm:
    """Plain importance-sampled policy gradient, no clipping
    (docs/losses.md#vanilla--importance-sampled-policy-gradient)."""
    none = torch.zeros_like(p.mask)
    return PolicyTerm(-p.r * p.adv, p.mask.to(p.r.dtype), none, none)


def _opsm_keep(cfg: PPOClipConfig, p: TokenView) -> Tensor:
    """[T] bool, False on the tokens OPSM drops (DeepSeek-V3.2, slime): its advantage condition is per
    token (token-level advantages may differ in sign within a sample), its drift condition per sample
    (docs/losses.md#grpo-bnpo-dr_grpo-dapo--the-clipped-ppo-surrogate)."""
    if cfg.opsm_delta is None:
        return torch.ones_like(p.mask)
    drift = segment_masked_mean(-p.log_r.detach(), p.mask, p.sample_lens)
    return ~((p.adv < 0) & broadcast_to_tokens(drift > cfg.opsm_delta, p.sample_lens))


@LOSSES.implements(GrpoLossConfig, BnpoLossConfig, DrGrpoLossConfig, DapoLossConfig)
def ppo_clip_loss(cfg: PPOClipConfig, p: TokenView, ratio: Tensor | None = None) -> PolicyTerm:
    """GRPO / BNPO / Dr. GRPO / DAPO, which differ in eps and normalization only: the clipped PPO surrogate
    with the optional dual clip and OPSM (`_opsm_keep`). A token's gate is 1, or 0 where a clip, the dual clip or
    OPSM removes its gradient; `ratio` replaces `p.r`
    (docs/losses.md#grpo-bnpo-dr_grpo-dapo--the-clipped-ppo-surrogate)."""
    r = p.r if ratio is None else ratio
    adv = p.adv
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    surrogate = torch.minimum(r * adv, r.clamp(lo, hi) * adv)
    rd = r.detach()
    clip_low = p.mask & (adv < 0) & (rd < lo)
    clip_high = p.mask & (adv > 0) & (rd > hi)
    if cfg.dual_clip_c is not None:
        # Dual clip: floor the surrogate of a negative-advantage token, which caps its loss.
        surrogate = torch.where(adv < 0, torch.maximum(surrogate, cfg.dual_clip_c * adv), surrogate)
        clip_high = clip_high | (p.mask & (adv < 0) & (rd > cfg.dual_clip_c))
    keep = _opsm_keep(cfg, p)
    loss = torch.where(keep & p.mask, -surrogate, torch.zeros_like(surrogate))
    gate = (p.mask & keep & ~clip_low & ~clip_high).to(r.dtype)
    extra = {}
    if cfg.opsm_delta is not None:
        extra["loss/opsm_masked_frac"] = _metric((~keep).float(), p.mask)
    # Tokens OPSM drops count as low-clipped: a negative token of a sample pushed below the sampler.
    clip_low = clip_low | (p.mask & ~keep)
    clip_high = clip_high & ~clip_low
    return PolicyTerm(loss, gate, clip_low, clip_high, extra)


@LOSSES.implements(GspoLossConfig, GspoTokenLossConfig)
def gspo_loss(cfg: GspoLossConfig, p: TokenView) -> PolicyTerm:
    """GSPO: the clipped surrogate on each sample's sequence ratio s_i, the gradient flowing through s_i;
    gspo_token: the same value with a per-token gradient path. The reported gate is s_i / r_t unclipped, 0 clipped
    (docs/losses.md#gspo-gspo_token--group-sequence-policy-optimization-arxiv-250718071)."""
    seq_log = segment_masked_mean(p.log_r, p.mask, p.sample_lens)
    s = broadcast_to_tokens(torch.exp(seq_log), p.sample_lens)
    if isinstance(cfg, GspoTokenLossConfig):
        s = s.detach() * torch.exp(p.lp - p.lp.detach())
    lo, hi = 1 - cfg.eps_low, 1 + cfg.eps_high
    surrogate = torch.minimum(s * p.adv, s.clamp(lo, hi) * p.adv)
    loss = p.off_mask_zero(-surrogate)
    sd = s.detach()
    clip_low = p.mask & (p.adv < 0) & (sd < lo)
    clip_high = p.mask & (p.adv > 0) & (sd > hi)
    gate = torch.where(p.mask & ~clip_low & ~clip_high, _safe_div(sd, p.r.detach()), torch.zeros_like(sd))
    return PolicyTerm(loss, gate, clip_low, clip_high, {"loss/sequence_ratio": _metric(sd, p.mask)},
                 through_ratio=not isinstance(cfg, GspoTokenLossConfig))


@LOSSES.implements(FipoLossConfig)
def fipo_loss(cfg: FipoLossConfig, p: TokenView) -> PolicyTerm:
    """FIPO: the DAPO loss (`ppo_clip_loss`) weighted per token by the future influence f_t, a clipped,
    discounted sum of the sample's later log ratios over its trained tokens only (`reverse_discounted_sum`; the clip
    acts on the exponent, so nothing overflows), detached unless detach_influence = false
    (docs/losses.md#fipo--future-kl-influence-policy-optimization)."""
    future = reverse_discounted_sum(p.log_r, p.mask, p.sample_lens, cfg.gamma)
    influence = torch.exp(future.clamp(math.log(1 - cfg.eps_f), math.log(1 + cfg.eps_f)))
    if cfg.detach_influence:
        influence = influence.detach()
    base = ppo_clip_loss(cfg, p)
    fd = influence.detach()
    extra = dict(base.extra)
    extra["loss/future_influence"] = _metric(fd, p.mask)
    return PolicyTerm(
        p.off_mask_zero(influence * base.loss), p.off_mask_zero(fd * base.gate), base.clip_low, base.clip_high, extra
    )


def _moments(p: TokenView) -> Tensor:
    """float64 `[sum log r, sum (log r)^2, count]` over `p`'s tokens (see `log_ratio_moments`)."""
    log_r = p.log_r.detach()[p.mask].to(torch.float64)
    return torch.stack([log_r.sum(), (log_r**2).sum(), log_r.new_tensor(float(log_r.numel()))])


def _log_ratio_variance(p: TokenView) -> float:
    """sigma2 of is_reshape, the unbiased variance of log r over the step's trained tokens, from the
    step's moments (`LossScale.log_ratio_moments`; this call's own when absent); 0 when n < 2 (float64 sums, a
    Python float). The formula: docs/losses.md#is_reshape--rényi-importance-sampling-reshape."""
    moments = p.log_ratio_moments
    s1, s2, n = moments if moments is not None else _moments(p).tolist()
    sigma2 = (s2 - s1 * s1 / n) / (n - 1) if n > 1 else 0.0
    return max(sigma2, 0.0)  # max: rounding can make a zero variance slightly negative


@LOSSES.implements(IsReshapeLossConfig)
def is_reshape_loss(cfg: IsReshapeLossConfig, p: TokenView) -> PolicyTerm:
    """Rényi IS reshape: the importance weight raised to a detached per-token exponent gamma, set from the
    variance of log r over the STEP's trained tokens (all micro-batches and ranks, `_log_ratio_variance`, so the loss
    does not depend on the split) and from the token's advantage and ratio; capped at clip_threshold with
    clip_weight. The reported gate is 0 where the cap is active
    (docs/losses.md#is_reshape--rényi-importance-sampling-reshape)."""
    log_w = p.log_r
    lw = log_w.detach()
    sigma2 = _log_ratio_variance(p)
    gamma_base = min(1.0, math.sqrt(-math.log(cfg.rho_min) / sigma2)) if sigma2 > 0 else 1.0
    gamma_target = torch.sigmoid(-cfg.T * lw)
    gate_p = torch.sigmoid(p.adv * lw / cfg.tau)
    gamma = torch.clamp(gamma_base + (gamma_target - gamma_base) * gate_p, min=cfg.gamma_min).detach()
    w_g = torch.exp(gamma * log_w)
    wd = w_g.detach()
    clip_high = torch.zeros_like(p.mask)
    if cfg.clip_weight:
        clip_high = p.mask & (wd > cfg.clip_threshold)
        w_g = w_g.clamp(max=cfg.clip_threshold)
    loss = p.off_mask_zero(-w_g * p.adv)
    gate = torch.where(p.mask & ~clip_high, _safe_div(gamma * wd, p.r.detach()), torch.zeros_like(wd))
    extra = {
        "loss/gamma_base": _scalar_metric(gamma_base),
        "loss/sigma_sq": _scalar_metric(sigma2),
        "loss/gamma": _metric(gamma, p.mask),
        "loss/is_ratio_used": _metric(w_g.detach(), p.mask),
    }
    return PolicyTerm(loss, gate, torch.zeros_like(p.mask), clip_high, extra)


@LOSSES.implements(CustomLossConfig)
def custom_loss(cfg: CustomLossConfig, p: TokenView) -> PolicyTerm:
    """User function, imported by path. `contract = "view"`: the built-in variants' contract,
    `fn(view: TokenView, **kwargs) -> PolicyTerm` (its gate and clip flags reported like theirs).
    `contract = "inputs"`: `fn(inputs: LossInputs, **kwargs)` returning per-token losses [T], a summed loss
    (0-dim), or `(loss, metrics)` with per-token metric tensors [T] (logged as `loss/<name>`, averaged over
    trained tokens); the framework masks and normalizes and reports no soft gate for it."""
    fn = import_callable(cfg.import_path)
    if cfg.contract == "view":
        term = fn(p, **cfg.kwargs)
        if not isinstance(term, PolicyTerm):
            raise TypeError(f"custom loss {cfg.import_path} (contract 'view') returned {type(term).__name__}, "
                            "expected a PolicyTerm")
        return term
    result = fn(p.inputs, **cfg.kwargs)
    user_metrics: dict[str, Tensor] = {}
    if isinstance(result, tuple):
        result, user_metrics = result
    if not isinstance(result, Tensor):
        raise TypeError(f"custom loss {cfg.import_path} returned {type(result).__name__}, expected a Tensor")
    if result.dim() == 0:
        if cfg.normalization == "sequence":
            raise ConfigError(
                f"custom loss {cfg.import_path} returned a summed loss; 'sequence' normalization needs per-token losses"
            )
        # A summed loss goes onto the first token so the normalizations divide it like a token sum.
        loss = torch.zeros_like(p.lp).index_put((torch.tensor([0], device=p.lp.device),), result.reshape(1))
    elif result.shape == p.lp.shape:
        loss = p.off_mask_zero(result)
    else:
        raise TypeError(
            f"custom loss {cfg.import_path} returned shape {tuple(result.shape)}, expected [] or {tuple(p.lp.shape)}"
        )
    extra = {f"loss/{name.removeprefix('loss/')}": _metric(value, p.mask) for name, value in user_metrics.items()}
    none = torch.zeros_like(p.mask)
    return PolicyTerm(loss, torch.zeros_like(p.r), none, none, extra)


# --------------------------------------------------------------------------------------
# Regularizers every variant accepts
# --------------------------------------------------------------------------------------


def kl_estimate(lp: Tensor, ref: Tensor, kl_type: str) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta, on d = lp - ref, by `kl_type`: k1,
    k2, k3 (its exp continued linearly below d = -LOG_RATIO_BOUND, so value and gradient stay finite for every finite
    d) or verl's low_var_kl (clamped). The formulas: docs/losses.md#regularizers-every-type."""
    d = lp - ref
    if kl_type == "k1":
        return d
    if kl_type == "k2":
        return 0.5 * d**2
    if kl_type == "k3":
        d_in = d.clamp(min=-LOG_RATIO_BOUND)  # d - d_in: how far below -B (0 inside, no gradient path)
        return torch.exp(-d_in) * (1 - (d - d_in)) + d - 1
    if kl_type == "low_var_kl":
        d = d.clamp(-20, 20)
        return (torch.exp(-d) + d - 1).clamp(-10, 10)
    raise ValueError(f"unknown kl_type {kl_type!r}")


def _regularizers(cfg: Any, p: TokenView, metrics: dict[str, Tensor]) -> Tensor:
    """The per-token term of the regularizers, KL penalty and entropy bonus (docs/losses.md#regularizers-every-type);
    records loss/kl_ref, loss/entropy, and loss/teacher_kl when the batch has teacher logprobs."""
    extra = torch.zeros_like(p.lp)
    inputs = p.inputs
    if cfg.kl_coef > 0:
        if inputs.ref_logprobs is None:
            raise ConfigError(f"loss.kl_coef = {cfg.kl_coef} > 0 but the batch has no ref_logprobs")
        ref = torch.where(p.mask, inputs.ref_logprobs.to(p.lp.dtype), p.lp.detach())
        kl = p.off_mask_zero(kl_estimate(p.lp, ref, cfg.kl_type))
        metrics["loss/kl_ref"] = _metric(kl, p.mask)
        extra = extra + cfg.kl_coef * kl
    if inputs.entropies is not None:
        entropy = p.off_mask_zero(inputs.entropies.to(p.lp.dtype))
        metrics["loss/entropy"] = _metric(entropy, p.mask)
        if cfg.entropy_coef > 0:
            extra = extra - cfg.entropy_coef * entropy
    elif cfg.entropy_coef > 0:
        raise ConfigError(f"loss.entropy_coef = {cfg.entropy_coef} > 0 but the trainer supplied no entropies")
    if inputs.teacher_logprobs is not None:
        # loss/teacher_kl: the k1 estimate of KL(pi_theta || teacher), sign as in docs/losses.md#on-policy-distillation.
        teacher = p.off_mask_zero(inputs.teacher_logprobs.to(p.lp.dtype))
        metrics["loss/teacher_kl"] = _metric(p.lp - teacher, p.mask)
    return extra


# --------------------------------------------------------------------------------------
# Normalization and the public entry points
# --------------------------------------------------------------------------------------


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


_CONFIG_ADAPTER: TypeAdapter[Any] = TypeAdapter(LossConfig)


def parse_loss_config(config: Any) -> Any:
    """A loss config model, or a dict like {"type": "sapo", "tau_pos": 1.0} validated as `[loss]` is."""
    return _CONFIG_ADAPTER.validate_python(dict(config) if isinstance(config, Mapping) else config)


class Loss:
    """The loss of one config: `loss(inputs, scale)` is one micro-batch's normalized contribution.

    Summing `loss` over all micro-batches of all ranks gives the step loss; metrics are
    `[sum, count]` pairs (see `reduce_metrics`). When `needs_log_ratio_moments` is true the
    variant reads a statistic of the whole step: run a no-grad pre-pass that sums
    `log_ratio_moments` of every micro-batch (all ranks) and pass
    `scale.with_log_ratio_moments(...)`, as `compute_step_loss` and the trainer do.
    """

    def __init__(self, config: Any):
        self.config = parse_loss_config(config)
        self._variant = LOSSES.implementation(self.config.type)
        self.needs_log_ratio_moments = self.config.needs_log_ratio_moments

    def __call__(self, inputs: LossInputs, scale: LossScale, outcomes: bool = False) -> LossOutputs:
        """One micro-batch's share of the step loss and its metrics; with `outcomes`, each token's
        (`token_outcomes`)."""
        cfg = self.config
        p = token_view(inputs, scale)
        term = self._variant(cfg, p)
        metrics: dict[str, Tensor] = {
            "loss/importance_ratio": _metric(p.r, p.mask),
            "loss/mismatch_kl": _metric(p.r - p.log_r - 1, p.mask),
            "loss/clip_frac_low": _metric(term.clip_low.float(), p.mask),
            "loss/clip_frac_high": _metric(term.clip_high.float(), p.mask),
            "loss/ratio_clamped_frac": _metric(p.clamped.float(), p.mask),
            "loss/nonfinite_ratio_frac": _metric((p.trained & ~p.mask).float(), p.trained),
        }
        if cfg.type != "custom" or cfg.contract == "view":
            gate = term.gate.masked_fill(p.clamped, 0.0) if term.through_ratio else term.gate
            metrics["loss/soft_gate_weight"] = _metric(gate.clamp(max=1.0), p.mask)
            metrics["loss/soft_gate_amplified_frac"] = _metric((gate > 1).float(), p.mask)
        per_token = term.loss + _regularizers(cfg, p, metrics)
        metrics.update(term.extra)
        loss = normalize(per_token, p.trained, p.sample_lens, cfg.normalization, scale)
        return LossOutputs(loss=loss, metrics=metrics, outcomes=token_outcomes(p, term) if outcomes else None)


def build_loss(config: Any) -> Loss:
    """The loss of `config` (a config model or a dict): see `Loss`."""
    return Loss(config)


def compute_step_loss(config: Any, micro_batches: Sequence[LossInputs], max_tokens: int) -> LossOutputs:
    """Single-process step: the summed contributions of `micro_batches` and the step's mean metrics.

    The same scale as the trainer: denominators summed over the micro-batches and, for a variant
    that needs them, the step's log-ratio moments (a no-grad pre-pass).
    """
    loss_fn = build_loss(config)
    counts = sum((scale_counts(mb) for mb in micro_batches), torch.zeros(3, dtype=torch.long))
    scale = LossScale.from_counts(counts, max_tokens=max_tokens)
    if loss_fn.needs_log_ratio_moments:
        moments = sum((log_ratio_moments(mb) for mb in micro_batches), torch.zeros(3, dtype=torch.float64))
        scale = scale.with_log_ratio_moments(moments)
    outputs = [loss_fn(mb, scale) for mb in micro_batches]
    loss = torch.stack([o.loss for o in outputs]).sum()
    metrics = {k: torch.tensor(v) for k, v in reduce_metrics([o.metrics for o in outputs]).items()}
    return LossOutputs(loss=loss, metrics=metrics)

"""The sampling distribution and its logprobs, shared by every request of the builtin engine.

For logits `z` (one position, float32) the distribution sampled from is `models.sampling_rule`'s:
p = softmax(z / T), restricted to the kept set of min_p, top_k and top_p and renormalised,
and the logprob reported for the sampled token is its logprob under that distribution. Without
truncation this is exactly the trainer's `log_softmax(logits / T)[token]`; with it the trainer
applies the same rule to its own logits (`trainer.model.token_logprobs`).

Any T > 0 is computed without overflow: below SMALL_TEMPERATURE the logits are shifted
by their maximum first (softmax does not change) and the divisor is at least the
smallest normal float32, so no tiny T turns `z / T` into inf - inf = NaN; the result
tends to a point mass on the argmax, as it should.

T = 0 is greedy decoding: the token is `argmax z` and the reported logprob is that of the
untempered model, `log_softmax(z)[token]` (the sampled distribution is a point mass, whose
logprob 0 carries no information; T = 1 is what a trainer would compare it with).

Both functions work on one position `[V]` or a batch of positions `[B, V]` (the engine
samples all running sequences that share sampling parameters in one call).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from prime_rl.models.sampling_rule import SamplingRule, kept_mask

SMALL_TEMPERATURE = 1e-2  # at or above it |z| / T stays far inside float32's range for any real logits
_TINY = torch.finfo(torch.float32).tiny


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / temperature` (T > 0) that never overflows into NaN (see the module docstring)."""
    if temperature >= SMALL_TEMPERATURE:
        return logits / temperature
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    return shifted / max(temperature, _TINY)


def processed_logprobs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0,
                       min_p: float = 0.0) -> torch.Tensor:
    """Log-probabilities [V] of the distribution actually sampled from (-inf outside the kept set)."""
    logits = logits.float()
    if temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = tempered(logits, temperature)
    rule = SamplingRule(temperature, top_k, top_p, min_p)
    if rule.truncates:
        scaled = scaled.masked_fill(~kept_mask(scaled, rule), float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample(logprobs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Draw one token from `processed_logprobs(...)` [V]; greedy (argmax) when temperature is 0."""
    return int(sample_rows(logprobs[None], temperature, [generator])[0])


def sample_rows(logprobs: torch.Tensor, temperature: float,
                generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row of `processed_logprobs(...)` [B, V] (row b from its own generator).

    Inverse-CDF sampling: with u_b ~ U[0, 1) from generator b and c = cumsum(p_b), the token is
    the smallest k with c_k > u_b * c_V, which has probability p_b[k] (a token outside the kept
    set, p = 0, never is). One uniform per row keeps seeded rows reproducible whatever else is
    in the batch, while the O(V) work is one batched op instead of a multinomial per row.
    """
    if temperature == 0:
        return torch.argmax(logprobs, dim=-1)
    uniforms = torch.stack([torch.rand((), generator=g) for g in generators]).to(logprobs.device)
    cdf = torch.cumsum(logprobs.exp(), dim=-1)
    tokens = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True)[:, 0]
    return tokens.clamp(max=logprobs.shape[-1] - 1)  # u * c_V can round up to c_V itself

"""The sampling rule: which distribution a token is drawn from, shared by the server (to sample) and
the trainer (to score the same distribution).

For logits `z` of one position and temperature T > 0, with s = z / T and p = softmax(s):

    min_p > 0    keep v iff p_v >= min_p * max_u p_u
    top_k > 0    keep v iff s_v >= the k-th largest s   (ties with the k-th are all kept)
    top_p < 1    over the tokens kept so far, renormalised to q: keep the most likely ones while
                 the mass of those before them is < top_p (the smallest most-likely set with mass
                 >= top_p; the most likely token always stays)

min_p and top_k each keep a most-likely prefix by a threshold the other does not move, so they
commute; top_p comes after both. This is vLLM's order (temperature, min_p, top-k, top-p), and
the same rule runs in the builtin engine. Among tokens tied at the edge of the top-p set this
rule keeps the lower token id (a stable descending sort); vLLM's kernels may keep other ones. The
sampled distribution is p renormalised over the kept set K:

    log q(v) = s_v - logsumexp_{u in K} s_u      (v in K; -inf outside)

With no truncation (top_k = -1, top_p = 1, min_p = 0) q = p and log q = log_softmax(s).

`vocab` restricts everything above to the ids [0, vocab): the tokenizer's ids. Models pad their output
embedding past the tokenizer (Qwen3: 151,936 rows for 151,669 ids) and a padded row has a logit like any
other, so without the restriction a sampler can draw an id no tokenizer can decode or accept back as a
prompt. The builtin server and the trainer both leave those logits out (p is a softmax over [0, vocab)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a mask is computed: configs and the launcher import this module too
    import torch


@dataclass(frozen=True)
class SamplingRule:
    """Temperature and truncation of one sampler (values checked by the configs and the request schema)."""

    temperature: float = 1.0
    top_k: int = -1  # -1 (or 0, or >= the vocabulary): off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    vocab: int | None = None  # ids that can be sampled, [0, vocab): the tokenizer's; None: every logit

    @property
    def truncates(self) -> bool:
        """True when some token of positive probability can be dropped (the kept set can be smaller than V)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def kept_mask(scaled: torch.Tensor, rule: SamplingRule) -> torch.Tensor:
    """Bool [..., V]: the kept set K of each position, from tempered logits `scaled` = z / T (module docstring).

    Not differentiable (the set is a step function of the logits); callers renormalise over it."""
    import torch

    scaled = scaled.detach().float()
    keep = torch.ones_like(scaled, dtype=torch.bool)
    vocab = scaled.shape[-1]
    if rule.min_p > 0.0:
        # p_v >= min_p * p_max  <=>  s_v - s_max >= log(min_p); computed on probabilities as vLLM does.
        probs = torch.softmax(scaled, dim=-1)
        keep &= probs >= rule.min_p * probs.amax(dim=-1, keepdim=True)
    if 0 < rule.top_k < vocab:
        kth = torch.topk(scaled, rule.top_k, dim=-1).values[..., -1:]
        keep &= scaled >= kth
    if rule.top_p < 1.0:
        masked = scaled.masked_fill(~keep, float("-inf"))
        sorted_logits, order = torch.sort(masked, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep a token if the mass strictly before it is below top_p; the top token always stays, even when
        # top_p is so small that it rounds to 0 in float32.
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= rule.top_p
        drop_sorted[..., 0] = False
        keep &= ~torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return keep

"""The sampling distribution and its logprobs, shared by every request of the builtin engine.

For logits `z` (one position, float32) the distribution sampled from is

    p = softmax(z / T)                       temperature T > 0
    p_k = p restricted to the k most likely tokens, renormalised        (top_k > 0)
    p_kp = smallest most-likely set whose mass under p_k is >= top_p,
           renormalised                                               (top_p < 1)

and the logprob reported for the sampled token is `log p_kp[token]`. Without top-k/top-p
this is exactly the trainer's `log_softmax(logits / T)[token]`.

T = 0 is greedy decoding: the token is `argmax z` and the reported logprob is that of the
untempered model, `log_softmax(z)[token]` (the sampled distribution is a point mass, whose
logprob 0 carries no information; T = 1 is what a trainer would compare it with).
"""

from __future__ import annotations

import torch


def processed_logprobs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities [V] of the distribution actually sampled from (-inf outside the kept set)."""
    logits = logits.float()
    if temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Keep a token if the mass strictly before it is below top_p (the top token always stays).
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample(logprobs: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Draw one token from `processed_logprobs(...)`; greedy (argmax) when temperature is 0."""
    if temperature == 0:
        return int(torch.argmax(logprobs))
    return int(torch.multinomial(logprobs.exp(), 1, generator=generator))

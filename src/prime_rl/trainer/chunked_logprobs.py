"""Per-token logprobs and entropies straight from the final hidden states, in chunks of tokens, so that no
[tokens, vocab] tensor of the whole sequence ever exists (forward or backward).

For hidden states h [N, H], the output embedding W [V, H] (bias b), targets a [N] and the sampling rule
(temperature T, truncation, sampled vocabulary `rule.vocab`):

    s = (h W^T + b)[:, :vocab] / T            the tempered logits (rows past `vocab` are never sampled)
    K = kept set of s under the rule, plus a   (`models.sampling_rule`; all of [0, vocab) without truncation)
    lp = s_a - logsumexp_{v in K} s_v
    H  = -sum_{v in K} q_v log q_v,  q = softmax of s over K

exactly `model.token_logprobs` of the full logits. The backward pass recomputes s chunk by chunk (the
kept set is a step function and is not differentiated through) with

    dlp/ds_v = 1[v = a] - q_v        dH/ds_v = -q_v (log q_v + H)       (0 outside K)

and ds/dh = W / T, ds/dW = h / T, ds/db = 1 / T. Only h, the targets and two floats per token are kept for
backward, so memory grows with tokens x hidden size, not tokens x vocabulary: at Qwen3's 151,936 rows a
chunk is `CHUNK_ELEMENTS // vocab` = 220 tokens on a CPU (about 130 MB per float32 copy of its logits) and
883 on a GPU. The product covers the first `vocab` rows rounded up to 64 (a product over 151,669 rows, an
odd count, ran 3x slower on an H100), and the few logits past `vocab` are -inf.

`token_stats_head` runs a Hugging Face causal LM with its output embedding answering (lp, H) per position
instead of logits (`models.output_head`: only for models whose logits are the head's output unchanged; others
are scored from their full logits).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from prime_rl.models.output_head import output_embedding_as
from prime_rl.models.sampling_rule import SamplingRule, kept_mask

CHUNK_ELEMENTS = 2**25  # logits per chunk on a CPU: 32M float32 = 128 MB per copy
CHUNK_ELEMENTS_CUDA = 2**27  # on a GPU, 4x more (fewer, larger products: 1.6x faster at 16k tokens on an H100)


def chunk_tokens(vocab: int, chunk_elements: int | None = None, device: torch.device | None = None) -> int:
    """Tokens per chunk: as many as keep one chunk's logits within `chunk_elements` (default `CHUNK_ELEMENTS`, on
    a CUDA `device` `CHUNK_ELEMENTS_CUDA`), at least one."""
    default = CHUNK_ELEMENTS_CUDA if device is not None and device.type == "cuda" else CHUNK_ELEMENTS
    return max(1, (chunk_elements or default) // max(vocab, 1))


ALIGN = 64  # rows of the embedding a chunk's product covers are rounded up to this


def _log_q(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
           rule: SamplingRule) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """(log q [n, W] float32 with -inf outside the kept set, the kept mask [n, W] when truncating else None, vocab)
    of one chunk: the operations of `model.token_logprobs` on these rows of the full logits. The product covers
    the first W = vocab rounded up to `ALIGN` rows of the embedding (all of them when that is more): a product
    over an odd row count (151,669) ran 3x slower on an H100; the W - vocab extra logits are set to -inf."""
    rows = weight.shape[0]
    vocab = rows if rule.vocab is None else min(rule.vocab, rows)
    width = min(rows, -(-vocab // ALIGN) * ALIGN)
    s = F.linear(h, weight[:width], None if bias is None else bias[:width]).float().div_(rule.temperature)
    s[:, vocab:] = float("-inf")
    kept = None
    if rule.truncates:
        kept = torch.zeros_like(s, dtype=torch.bool)
        kept[:, :vocab] = kept_mask(s[:, :vocab], rule)
        kept.scatter_(-1, targets[:, None], True)
        s.masked_fill_(~kept, float("-inf"))
    return torch.log_softmax(s, dim=-1), kept, vocab


def _finite(logq: torch.Tensor, kept: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """log q over the sampled vocabulary [n, vocab] with 0 where it is -inf (outside the kept set): 0 * -inf
    would be NaN in the entropy and its gradient."""
    return logq[:, :vocab] if kept is None else logq[:, :vocab].masked_fill(~kept[:, :vocab], 0.0)


class _TokenStats(torch.autograd.Function):
    """(lp [N], H [N]) of `token_stats`; see the module docstring for the math."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, rule: SamplingRule, entropies: bool, chunk: int):
        lp = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        ent = torch.zeros_like(lp)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logq, kept, vocab = _log_q(hidden[rows], weight, bias, targets[rows], rule)
            lp[rows] = logq.gather(-1, targets[rows, None])[:, 0]
            if entropies:
                ent[rows] = -(logq[:, :vocab].exp() * _finite(logq, kept, vocab)).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, ent)
        ctx.rule, ctx.entropies, ctx.chunk = rule, entropies, chunk
        ctx.set_materialize_grads(False)  # an output the loss does not use (often H) costs nothing in backward
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, bias, targets, ent = ctx.saved_tensors
        rule = ctx.rule
        want_h, want_w, want_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if want_b else None
        use_ent = ctx.entropies and grad_ent is not None
        if grad_lp is None and not use_ent:
            return None, None, None, None, None, None, None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            logq, kept, vocab = _log_q(hidden[rows], weight, bias, targets[rows], rule)
            width = logq.shape[-1]
            q = logq.exp()  # 0 outside the kept set
            if grad_lp is not None:
                grad_s = q * -grad_lp[rows, None]
                grad_s.scatter_add_(-1, targets[rows, None], grad_lp[rows, None])
            else:
                grad_s = torch.zeros_like(q)
            if use_ent:
                spread = (_finite(logq, kept, vocab) + ent[rows, None]).mul_(grad_ent[rows, None])
                grad_s[:, :vocab].addcmul_(q[:, :vocab], spread, value=-1.0)
            grad_s = grad_s.div_(rule.temperature).to(weight.dtype)  # d/d(h W^T + b)
            if want_h:
                grad_h[rows] = grad_s @ weight[:width]
            if want_w:
                grad_w[:width] += (grad_s.T @ hidden[rows]).float()
            if want_b:
                grad_b[:width] += grad_s.float().sum(0)
        return (grad_h, None if grad_w is None else grad_w.to(weight.dtype),
                None if grad_b is None else grad_b.to(bias.dtype), None, None, None, None)


def token_stats(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                rule: SamplingRule = SamplingRule(), entropies: bool = True, chunk: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lp [N], H [N]) float32 of the targets [N] under the rule, from hidden states [N, H] and the output
    embedding (module docstring); differentiable in hidden, weight and bias. H is 0 without `entropies`."""
    chunk = chunk or chunk_tokens(weight.shape[0], device=hidden.device)
    return _TokenStats.apply(hidden, weight, bias, targets, rule, entropies, chunk)


@contextmanager
def token_stats_head(model: nn.Module, targets: torch.Tensor, rule: SamplingRule, entropies: bool,
                     scored: torch.Tensor | None = None) -> Iterator[None]:
    """While open, `model`'s forward returns [..., 2] = (lp, H) per position instead of logits [..., V]: the
    output embedding is called with hidden states [..., H] at the positions the model keeps (all, or
    `logits_to_keep`), whose flattened order `targets` [N] follows (the token each position predicts).
    `scored`: long indices into those N positions, the only ones whose (lp, H) is wanted (not padding, nor a
    segment's last token, which predicts nothing of its own): the head's products run on these rows alone and
    the others answer (0, 0). Only for models with `models.output_head.head_output_is_logits`."""

    def stats(hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        wanted = targets.to(flat.device)
        if scored is not None:
            flat, wanted = flat[scored], wanted[scored]
        lp, ent = token_stats(flat, head.weight, head.bias, wanted, rule, entropies)
        if scored is not None:
            everywhere = lp.new_zeros(hidden.shape[:-1].numel())
            lp, ent = (everywhere.scatter(0, scored, x) for x in (lp, ent))
        shape = hidden.shape[:-1]
        return torch.stack([lp.reshape(shape), ent.reshape(shape)], dim=-1)  # a new tensor, not a view (FSDP)

    with output_embedding_as(model, stats) as head:
        yield

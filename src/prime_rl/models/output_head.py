"""Running a causal LM with its output embedding (lm_head) answering something other than logits.

Hugging Face's causal LMs compute `logits = lm_head(h)` from the final hidden states h at the positions
they keep (`logits_to_keep`) and, for most architectures, return that unchanged. For those
(`head_output_is_logits`), replacing the head's forward for one call gives the caller h itself (the builtin
engine: logits of only the positions it samples, in chunks) or per-token statistics computed from h in
chunks (`trainer.chunked_logprobs`: logprobs and entropies), so the [tokens, vocab] logits of a whole sequence are
never materialised. A model that rescales or soft-caps its logits after the head (Gemma 2, Granite,
Cohere) is left alone and run as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn

HEAD_IS_LOGITS_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mistral", "mixtral",
                                        "phi3", "olmo2", "gemma"})


def head_output_is_logits(model: nn.Module) -> bool:
    """True when `model`'s logits are its output embedding's result unchanged and that embedding is a Linear."""
    config = getattr(model, "config", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (getattr(config, "model_type", None) in HEAD_IS_LOGITS_MODEL_TYPES and type(head) is nn.Linear
            and getattr(config, "final_logit_softcapping", None) is None)


@contextmanager
def output_embedding_as(model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[nn.Linear]:
    """While open, `model`'s output embedding answers `forward(h)` for the hidden states h [..., H] it is
    called with (pre-hooks still run); yields the embedding, whose weight and bias the caller may use."""
    head = model.get_output_embeddings()
    head.forward = forward
    try:
        yield head
    finally:
        del head.forward

"""The sampled vocabulary: the token ids a sampler may draw, [0, tokenizer_vocab(tokenizer)).

A model's output embedding is often padded past its tokenizer (Qwen3: 151,936 rows for 151,669 ids;
padded to a multiple of 64 or 128 for fast kernels). A padded row still has a logit, so a sampler over
every row can draw an id that no tokenizer decodes or accepts back as a prompt. The builtin server and
the trainer both sample and score over the tokenizer's ids only (`SamplingRule.vocab`).
"""

from __future__ import annotations

from pathlib import Path


def tokenizer_vocab(tokenizer) -> int:
    """One past the largest id `tokenizer` knows (added tokens included): `len(tokenizer)` unless its ids
    have gaps."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def local_tokenizer_vocab(path: str, trust_remote_code: bool = False) -> int | None:
    """`tokenizer_vocab` of the tokenizer of `path`: a local model directory, or a hub name in the local Hugging
    Face cache (never downloaded); None when neither has one (a name only the server resolves)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                  local_files_only=not Path(path).is_dir())
    except (OSError, ValueError):
        return None
    return tokenizer_vocab(tokenizer)

"""The sampled vocabulary: the token ids a sampler may draw, [0, tokenizer_vocab(tokenizer)).

A model's output embedding is often padded past its tokenizer (Qwen3: 151,936 rows for 151,669 ids;
padded to a multiple of 64 or 128 for fast kernels). A padded row still has a logit, so a sampler over
every row can draw an id that no tokenizer decodes or accepts back as a prompt. The builtin server and
the trainer both sample and score over the tokenizer's ids only (`SamplingRule.vocab`).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def tokenizer_vocab(tokenizer) -> int:
    """One past the largest id `tokenizer` knows (added tokens included): `len(tokenizer)` unless its ids
    have gaps."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def local_tokenizer_vocab(path: str, trust_remote_code: bool = False) -> int | None:
    """`tokenizer_vocab` of the tokenizer of `path`: a local model directory, or a hub name in the local Hugging
    Face cache (never downloaded); None when neither has one (a name only the server resolves). A directory with
    a fast tokenizer's files is read without transformers (`files_tokenizer_vocab`)."""
    if Path(path).is_dir() and (vocab := files_tokenizer_vocab(Path(path))) is not None:
        return vocab
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                  local_files_only=not Path(path).is_dir())
    except (OSError, ValueError):
        return None
    return tokenizer_vocab(tokenizer)


def files_tokenizer_vocab(directory: Path) -> int | None:
    """`tokenizer_vocab` of the tokenizer in `directory` read from its files, without importing transformers
    (seconds of a process's start on a small CPU): one past the largest id of tokenizer.json (vocabulary and
    added tokens). None, so the caller loads the tokenizer, when there is no tokenizer.json, the tokenizer ships
    its own code (`auto_map`), or tokenizer_config.json names a token (`added_tokens_decoder`, a special token)
    that tokenizer.json does not hold: loading appends it, whatever id the config gives."""
    tokenizer_file, config_file = directory / "tokenizer.json", directory / "tokenizer_config.json"
    if not tokenizer_file.is_file():
        return None
    from tokenizers import Tokenizer

    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if config.get("auto_map"):
        return None
    ids = Tokenizer.from_file(str(tokenizer_file)).get_vocab(with_added_tokens=True)
    extra = config.get("extra_special_tokens") or []
    named = [config.get(key) for key in SPECIAL_TOKEN_KEYS] + list(config.get("additional_special_tokens") or [])
    named += list(extra.values() if isinstance(extra, dict) else extra)
    named += list(config.get("added_tokens_decoder", {}).values())
    if not {token["content"] if isinstance(token, dict) else token for token in named if token} <= ids.keys():
        return None
    return max(ids.values(), default=-1) + 1

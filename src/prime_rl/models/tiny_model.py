"""Tiny Qwen3-architecture models made from nothing (random init + the char tokenizer).

Tests and the embedded default model start here, so nothing is ever downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerBase, Qwen3Config

from prime_rl.models.char_tokenizer import build_char_tokenizer


def tiny_qwen3_config(tokenizer: PreTrainedTokenizerBase, hidden_size: int = 128, num_layers: int = 4,
                      num_heads: int = 4, num_kv_heads: int = 2, max_position_embeddings: int = 512,
                      vocab_size: int | None = None) -> Qwen3Config:
    """A small Qwen3 config sized for `tokenizer` (defaults: ~0.8M parameters with the char tokenizer); a
    `vocab_size` above the tokenizer's pads the embeddings as real models do (rows no token id names)."""
    return Qwen3Config(
        vocab_size=max(vocab_size or 0, len(tokenizer)),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def save_random_model(path: Path, seed: int = 0, **config_kwargs) -> Path:
    """Write a randomly initialised tiny Qwen3 + char tokenizer to `path` (HF format)."""
    tokenizer = build_char_tokenizer()
    config = tiny_qwen3_config(tokenizer, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=config.bos_token_id
    )
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

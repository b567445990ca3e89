"""Real tokenizers (Qwen3, Meta Llama 3) vendored under `tests/fixtures/tokenizers/`, and tiny random models
built on them.

The fixtures hold `tokenizer.json.xz` (xz-compressed, byte-identical once decompressed) beside the original
`tokenizer_config.json` (with the chat template) and the license files; `SOURCE.md` in each folder says where they
come from. Nothing here touches the network.

- `tokenizer_dir(name)`: a directory `AutoTokenizer.from_pretrained` loads, decompressed once into a cache.
- `load_tokenizer(name)`: that tokenizer, loaded.
- `tiny_model_config(name)`: a tiny config of the real architecture with the real vocab_size and special ids.
- `save_tiny_model(name, path, seed=0)`: a seeded random model of that config + the tokenizer files, in HF format.

The session fixtures `qwen3_tokenizer_dir`, `llama3_tokenizer_dir`, `qwen3_tiny_model`, `llama3_tiny_model` in
`tests/conftest.py` wrap these.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizers"


@dataclass(frozen=True)
class RealTokenizer:
    """What a tokenizer fixture is and the ids its real models carry in config.json / generation_config.json."""

    name: str
    architecture: str  # transformers model class of the real models
    tokenizer_len: int  # len(tokenizer): vocabulary + added tokens
    vocab_size: int  # rows of the real models' embedding (>= tokenizer_len: padded rows)
    bos_token_id: int
    eos_token_id: int  # config.json
    generation_eos_token_id: tuple[int, ...]  # generation_config.json
    generation_pad_token_id: int | None  # generation_config.json (None: the real model has none)
    tie_word_embeddings: bool
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int

    @property
    def fixture(self) -> Path:
        return FIXTURES / self.name


REAL_TOKENIZERS: dict[str, RealTokenizer] = {
    # Qwen/Qwen3-0.6B: eos <|im_end|>; generation also stops at <|endoftext|>, which is the pad token too.
    "qwen3": RealTokenizer(
        name="qwen3", architecture="Qwen3ForCausalLM", tokenizer_len=151669, vocab_size=151936,
        bos_token_id=151643, eos_token_id=151645, generation_eos_token_id=(151645, 151643),
        generation_pad_token_id=151643, tie_word_embeddings=True, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960,
    ),
    # meta-llama/Meta-Llama-3-8B-Instruct: eos <|eot_id|>; generation also stops at <|end_of_text|>; no pad token.
    "llama3": RealTokenizer(
        name="llama3", architecture="LlamaForCausalLM", tokenizer_len=128256, vocab_size=128256,
        bos_token_id=128000, eos_token_id=128009, generation_eos_token_id=(128001, 128009),
        generation_pad_token_id=None, tie_word_embeddings=False, rope_theta=500_000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192,
    ),
}


def _spec(name: str) -> RealTokenizer:
    try:
        return REAL_TOKENIZERS[name]
    except KeyError:
        raise ValueError(f"unknown real tokenizer {name!r}: one of {sorted(REAL_TOKENIZERS)}") from None


def default_cache_dir() -> Path:
    """Per-user folder under the system temp dir; survives between test runs until the temp dir is cleaned."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"prime-rl-test-tokenizers-{uid}"


def _fixture_digest(fixture: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(fixture.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def tokenizer_dir(name: str, cache_dir: Path | None = None) -> Path:
    """A directory with the `name` ("qwen3" or "llama3") tokenizer files, loadable by `AutoTokenizer.from_pretrained`.

    Decompressed once into `cache_dir` (default `default_cache_dir()`) under a name keyed by the fixture's content,
    so an updated fixture gets a new directory. Safe with several processes at once (pytest-xdist): each one builds in
    its own temporary directory and renames it into place; the rename is atomic, and whoever loses the race drops
    its copy. A directory under the final name is therefore always complete.
    """
    fixture = _spec(name).fixture
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"{name}-{_fixture_digest(fixture)}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        for source in sorted(fixture.iterdir()):
            if source.suffix == ".xz":
                with lzma.open(source) as src, open(staging / source.stem, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                shutil.copyfile(source, staging / source.name)
        try:
            os.replace(staging, final)
        except OSError:  # another process got there first (the target exists and is not empty)
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def load_tokenizer(name: str, cache_dir: Path | None = None):
    """The `name` tokenizer loaded with `AutoTokenizer.from_pretrained` (a fresh object each call)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir(name, cache_dir))


def tiny_model_config(name: str, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                      head_dim: int = 16, intermediate_size: int = 128, **overrides):
    """A tiny config of the real architecture: real vocab_size (padded past the tokenizer for Qwen3), real bos/eos
    ids, tying, rope theta, norm eps and context length; only the sizes are small. `overrides` go to the config."""
    from transformers import LlamaConfig, Qwen3Config

    spec = _spec(name)
    config_class = {"Qwen3ForCausalLM": Qwen3Config, "LlamaForCausalLM": LlamaConfig}[spec.architecture]
    kwargs = dict(
        architectures=[spec.architecture],
        vocab_size=spec.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=spec.bos_token_id,
        eos_token_id=spec.eos_token_id,
    )
    kwargs.update(overrides)
    return config_class(**kwargs)


def save_tiny_model(name: str, path: Path, seed: int = 0, dtype=None, cache_dir: Path | None = None,
                    **config_kwargs) -> Path:
    """Write a randomly initialised tiny `name` model (see `tiny_model_config`) to `path` with `save_pretrained`,
    plus `generation_config.json` with the real model's eos/pad ids (no sampling defaults) and the fixture's
    tokenizer files copied verbatim. Deterministic for a given seed (float32 unless `dtype` says otherwise).
    Returns `path`."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    spec = _spec(name)
    config = tiny_model_config(name, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    generation = {"bos_token_id": spec.bos_token_id, "eos_token_id": list(spec.generation_eos_token_id)}
    if spec.generation_pad_token_id is not None:
        generation["pad_token_id"] = spec.generation_pad_token_id
    model.generation_config = GenerationConfig(**generation)
    path = Path(path)
    model.save_pretrained(path)
    for source in tokenizer_dir(name, cache_dir).iterdir():
        shutil.copyfile(source, path / source.name)
    return path

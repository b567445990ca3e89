"""Fixtures and settings every test shares (helpers live in `tests/support/`)."""

from __future__ import annotations

import os
import sys

import pytest

# The suite's processes cache their bytecode. Where PYTHONDONTWRITEBYTECODE is set (many container images set it),
# every xdist worker would rewrite and compile each test module again on every run, and each of the suite's
# subprocesses (rl, its components, torchrun ranks) would compile prime_rl from source at its start: the fast tier
# took 85 s instead of 72 s that way on 2 cores. Only `__pycache__/` folders are written (git ignores them). Set
# here, before pytest-xdist starts its workers, so they and every process they start inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Tests never touch the network: hub lookups fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen3 (hidden 64, 2 layers) with the char tokenizer, saved in HF format."""
    from prime_rl.models.tiny_model import save_random_model

    return save_random_model(tmp_path_factory.mktemp("tiny_model"), seed=0, hidden_size=64, num_layers=2)


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir():
    """The real Qwen3 tokenizer (151,669 tokens, thinking chat template), loadable by AutoTokenizer.from_pretrained."""
    from tests.support.real_tokenizers import tokenizer_dir

    return tokenizer_dir("qwen3")


@pytest.fixture(scope="session")
def llama3_tokenizer_dir():
    """The real Meta Llama 3 Instruct tokenizer (128,256 tokens, `<|eot_id|>` chat template)."""
    from tests.support.real_tokenizers import tokenizer_dir

    return tokenizer_dir("llama3")


@pytest.fixture(scope="session")
def qwen3_tiny_model(tmp_path_factory):
    """A random tiny Qwen3ForCausalLM (hidden 64, 2 layers, vocab 151,936, tied) + the real Qwen3 tokenizer,
    HF format."""
    from tests.support.real_tokenizers import save_tiny_model

    return save_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3_tiny_model"), seed=0)


@pytest.fixture(scope="session")
def llama3_tiny_model(tmp_path_factory):
    """A random tiny LlamaForCausalLM (hidden 64, 2 layers, vocab 128,256, untied) + the real Llama 3 tokenizer."""
    from tests.support.real_tokenizers import save_tiny_model

    return save_tiny_model("llama3", tmp_path_factory.mktemp("llama3_tiny_model"), seed=0)


@pytest.fixture(autouse=True)
def _no_prime_env(monkeypatch):
    """PRIME_* variables of the developer's shell must not leak into config tests."""
    for key in list(os.environ):
        if key.startswith("PRIME_"):
            monkeypatch.delenv(key)


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run where CUDA is available and are skipped (with the reason) elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

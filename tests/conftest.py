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


def _pin_float_kernels() -> None:
    """The same float kernels on every x86-64 machine with AVX2, so that a learning test gives the same numbers on
    every machine, not only on every run of one machine. torch picks its vectorised kernels by the CPU (AVX-512 where
    the CPU has it, else AVX2), and MKL its matrix products likewise: their results differ in the last bits, and 150
    steps of an SFT warm-up grow that into another model (the reasoning-gym example's held-out rate started at 0.484
    with AVX-512 kernels and at 0.555 with AVX2 ones, the same commit on the same machine; thread counts 1 and 2 gave
    bitwise the same weights). Set before torch is imported (here, in pytest's first process, which the xdist
    workers and every process a test starts inherit); a value already in the environment is kept."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return
    try:
        with open("/proc/cpuinfo") as f:
            has_avx2 = " avx2" in f.read()
    except OSError:
        return
    if has_avx2:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")  # torch's own vectorised kernels
        os.environ.setdefault("MKL_CBWR", "AVX2")  # MKL's conditional numerical reproducibility: its AVX2 path
        os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN's kernels, capped likewise


_pin_float_kernels()

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


TIERS = {  # marker: why the README's suite skips it (a tier runs when `-m` names it)
    "learning": "the learning tier (an example's learning run, minutes): `uv run pytest -m learning` runs it; CI runs "
                "it after this suite",
    "faults": "the faults tier (rl's processes killed and stopped, restarted end to end, a minute each): `uv run "
              "pytest -m faults` runs it; CI runs it beside the learning tier",
}


def pytest_collection_modifyitems(config, items):
    """`learning` and `faults` tests run only when `-m` names their tier (`uv run pytest -m learning`): the README's
    `uv run pytest` skips them, saying how to run them. `gpu` tests run where CUDA is available and are skipped (with
    the reason) elsewhere."""
    wanted = config.getoption("markexpr") or ""
    for item in items:
        for tier, reason in TIERS.items():
            if tier in item.keywords and tier not in wanted:
                item.add_marker(pytest.mark.skip(reason=reason))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

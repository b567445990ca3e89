"""weights/step_N: complete HF directories, written atomically, newest keep_weights kept, loadable."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.run_dir import weights_dir
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.publish_weights import write_weights
from prime_rl.utils.fs import list_steps


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir):
    init_distributed()  # a one-process group (get_model_state_dict is a collective)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model, build_char_tokenizer()


def test_written_weights_load_and_match(tmp_path, model_and_tok):
    model, tok = model_and_tok
    path = write_weights(model, tok, tmp_path, 1, is_main=True)
    assert path == weights_dir(tmp_path, 1)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert AutoTokenizer.from_pretrained(path)("abc")["input_ids"] == tok("abc")["input_ids"]


def test_keep_last_n(tmp_path, model_and_tok):
    model, tok = model_and_tok
    for step in range(1, 6):
        write_weights(model, tok, tmp_path, step, is_main=True, keep=2)
    assert list_steps(tmp_path / "weights") == [4, 5]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step_4", "step_5"]  # no temp dirs left


def test_failed_write_leaves_nothing(tmp_path, model_and_tok, monkeypatch):
    model, tok = model_and_tok

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tok, "save_pretrained", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_weights(model, tok, tmp_path, 3, is_main=True)
    assert not weights_dir(tmp_path, 3).exists()
    assert list((tmp_path / "weights").iterdir()) == []

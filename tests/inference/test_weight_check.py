"""`weight_check`: an update directory must fit the served model, or it is refused before any swap."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.inference.weight_check import Reference, verify_weight_dir
from prime_rl.utils.errors import UserError
from tests.support.weight_dirs import EMBED, MISMATCHES, variant


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return Reference.from_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))


@pytest.mark.parametrize("name", sorted(MISMATCHES))
def test_a_directory_that_does_not_fit_the_model_is_refused(tiny_model_dir, tmp_path, reference, name):
    edit_tensors, edit_config, words = MISMATCHES[name]
    path = variant(tiny_model_dir, tmp_path / "step_1", edit_tensors, edit_config)
    with pytest.raises(UserError) as caught:
        verify_weight_dir(path, reference, keep=True)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("value", [float("-inf"), float("nan")])
def test_one_bad_value_in_a_bf16_tensor_is_found(tiny_model_dir, tmp_path, reference, value):
    def edit(tensors):
        tensors[EMBED] = tensors[EMBED].bfloat16()
        tensors[EMBED][-1, -1] = value

    path = variant(tiny_model_dir, tmp_path / "step_1", edit)
    with pytest.raises(UserError, match=f"tensor {EMBED} holds NaN or infinite values"):
        verify_weight_dir(path, reference, keep=False)


def test_a_matching_directory_is_accepted_with_tied_names_and_trainer_floats(tiny_model_dir, tmp_path, reference):
    assert frozenset({EMBED, "lm_head.weight"}) in reference.tied
    tensors = verify_weight_dir(tiny_model_dir, reference, keep=True)  # as save_pretrained writes it: no lm_head
    assert EMBED in tensors and "lm_head.weight" not in tensors
    bf16 = variant(tiny_model_dir, tmp_path / "step_1", lambda t: t.update({k: v.bfloat16() for k, v in t.items()}))
    assert verify_weight_dir(bf16, reference, keep=False) == {}  # a bf16 trainer's output is cast on load


def test_tied_names_present_together_must_agree(tiny_model_dir, tmp_path, reference):
    same = variant(tiny_model_dir, tmp_path / "step_1", lambda t: t.__setitem__("lm_head.weight", t[EMBED].clone()))
    assert set(verify_weight_dir(same, reference, keep=True)) >= {EMBED, "lm_head.weight"}
    shutil.rmtree(same)
    differ = variant(tiny_model_dir, tmp_path / "step_1", lambda t: t.__setitem__("lm_head.weight", t[EMBED] + 1))
    with pytest.raises(UserError, match="tied tensors lm_head.weight and model.embed_tokens.weight differ"):
        verify_weight_dir(differ, reference, keep=True)


def test_no_tied_name_at_all_is_missing(tiny_model_dir, tmp_path, reference):
    path = variant(tiny_model_dir, tmp_path / "step_1", lambda t: t.pop(EMBED))
    with pytest.raises(UserError, match="1 of 25 tensors missing \\(lm_head.weight or model.embed_tokens.weight\\)"):
        verify_weight_dir(path, reference, keep=False)


def test_reference_from_the_start_directory_matches_the_models_own(tiny_model_dir, tmp_path, reference):
    """The vLLM middleware compares with the directory vLLM loaded: same verdicts as the live model."""
    from_dir = Reference.from_dir(tiny_model_dir)
    assert from_dir.specs == reference.specs and from_dir.tied == reference.tied
    verify_weight_dir(tiny_model_dir, from_dir, keep=False)
    path = variant(tiny_model_dir, tmp_path / "step_1", MISMATCHES["missing_tensors"][0])
    with pytest.raises(UserError, match="tensors missing"):
        verify_weight_dir(path, from_dir, keep=False)


def test_unreadable_files_are_one_line_errors(tiny_model_dir, tmp_path, reference):
    path = shutil.copytree(tiny_model_dir, tmp_path / "step_1")
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with pytest.raises(UserError, match="cannot read"):
        verify_weight_dir(path, reference, keep=True)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="is not a JSON object"):
        verify_weight_dir(path, reference, keep=True)



@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_fifo_is_refused_not_read(tiny_model_dir, tmp_path, reference, name):
    """A FIFO would block safe_open (and, as it holds the GIL, the whole server) forever: it is opened without
    blocking (O_NONBLOCK) and refused on its fstat. A writer process opens it after a while, so a regression fails
    here instead of hanging the test run."""
    import os
    import subprocess
    import time

    path = tmp_path / "step_1"
    shutil.copytree(tiny_model_dir, path)
    target = path / name if name == "config.json" else next(path.glob("*.safetensors"))
    target.unlink()
    os.mkfifo(target)
    unblock = subprocess.Popen(["sh", "-c", 'sleep 5; : > "$0"', str(target)])
    try:
        start = time.monotonic()
        with pytest.raises(UserError) as caught:
            verify_weight_dir(path, reference, keep=False)
        assert time.monotonic() - start < 4, "verify_weight_dir blocked on a FIFO"
        assert str(caught.value) == f"weight file {target} is not a regular file"
    finally:
        unblock.kill()
        unblock.wait()

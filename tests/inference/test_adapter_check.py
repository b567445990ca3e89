"""LoRA adapter updates: `adapter_check` refuses what does not fit the served model, the builtin engine
merges an adapter into a copy of its base weights (and serves what peft computes), nothing is half-applied."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from prime_rl.inference.adapter_check import verify_adapter_dir
from prime_rl.inference.builtin.engine import Engine
from prime_rl.inference.weight_dirs import WeightPathForbidden
from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from prime_rl.utils.errors import UserError
from tests.support.lora_adapters import logits, lora_model, write_adapter
from tests.support.weight_dirs import check_weight_dir

IDS = [5, 17, 30, 2, 44, 61, 9]
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
NORM = "base_model.model.model.norm.weight"


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = Engine(str(tiny_model_dir), context_len=64, seed=0, max_batch_size=2)
    yield eng
    eng.close()


def _update(engine, path, step):
    engine.apply_weights(engine.stage_weights(str(path)), step)


def test_an_adapter_serves_what_peft_computes_and_replaces_the_previous_one(engine, tiny_model_dir, tmp_path):
    base = logits(engine.model, IDS)
    first = write_adapter(tiny_model_dir, tmp_path, step=1, seed=0, rank=4, alpha=8.0)
    second = write_adapter(tiny_model_dir, tmp_path, step=2, seed=5, rank=2, alpha=2.0, target_modules=["o_proj"])
    for path, seed, lora in ((first, 0, dict(rank=4, alpha=8.0)),
                             (second, 5, dict(rank=2, alpha=2.0, target_modules=["o_proj"]))):
        _update(engine, path, int(path.name.split("_")[1]))
        peft_model = lora_model(tiny_model_dir, seed, **lora)[0]
        # Adapters replace each other: the second one's model is the base plus its own o_proj change only.
        torch.testing.assert_close(logits(engine.model, IDS), logits(peft_model, IDS), atol=1e-5, rtol=1e-5)
    assert engine.weight_step == 2
    _update(engine, tiny_model_dir, 0)  # full weights (the step-0 reload) are the base again
    torch.testing.assert_close(logits(engine.model, IDS), base, atol=0, rtol=0)
    _update(engine, first, 1)
    _update(engine, tiny_model_dir, 0)
    torch.testing.assert_close(logits(engine.model, IDS), base, atol=0, rtol=0)


def test_saved_modules_are_served_and_restored_when_the_next_adapter_lacks_them(engine, tiny_model_dir, tmp_path):
    base = logits(engine.model, IDS)
    base_norm = engine.model.state_dict()["model.norm.weight"].clone()
    with_norms = write_adapter(tiny_model_dir, tmp_path, step=1, seed=0, rank=4, modules_to_save=["norm"])
    plain = write_adapter(tiny_model_dir, tmp_path, step=2, seed=3, rank=4)
    _update(engine, with_norms, 1)
    torch.testing.assert_close(logits(engine.model, IDS), logits(
        lora_model(tiny_model_dir, 0, rank=4, modules_to_save=["norm"])[0], IDS), atol=1e-5, rtol=1e-5)
    assert not torch.equal(engine.model.state_dict()["model.norm.weight"], base_norm)
    _update(engine, plain, 2)  # adapters replace each other: the norms go back to the base's
    assert torch.equal(engine.model.state_dict()["model.norm.weight"], base_norm)
    torch.testing.assert_close(logits(engine.model, IDS), logits(lora_model(tiny_model_dir, 3, rank=4)[0], IDS),
                               atol=1e-5, rtol=1e-5)
    _update(engine, with_norms, 3)
    _update(engine, tiny_model_dir, 0)
    torch.testing.assert_close(logits(engine.model, IDS), base, atol=0, rtol=0)


def _edit_config(**changes):
    def edit(path):
        config = json.loads((path / ADAPTER_CONFIG).read_text())
        config.update(changes)
        (path / ADAPTER_CONFIG).write_text(json.dumps(config))
    return edit


def _edit_tensors(change):
    def edit(path):
        tensors = load_file(path / ADAPTER_WEIGHTS)
        change(tensors)
        save_file(tensors, str(path / ADAPTER_WEIGHTS))
    return edit


def _poison(tensors):
    tensors[Q_B] = tensors[Q_B].clone()
    tensors[Q_B][0, 0] = float("nan")


BROKEN = {
    "not_lora": (_edit_config(peft_type="PREFIX_TUNING"), "is not a LoRA adapter"),
    "rank_not_int": (_edit_config(r="4"), "r must be an integer >= 1"),
    "rank_zero": (_edit_config(r=0), "r must be an integer >= 1"),
    "alpha_nan": (lambda p: (p / ADAPTER_CONFIG).write_text(
        (p / ADAPTER_CONFIG).read_text().replace('"lora_alpha": 8.0', '"lora_alpha": NaN')), "lora_alpha"),
    "dora": (_edit_config(use_dora=True), "use_dora = True is not supported"),
    "rank_pattern": (_edit_config(rank_pattern={"q_proj": 2}), "rank_pattern"),
    "bias": (_edit_config(bias="all"), "bias = 'all' is not supported"),
    "config_not_object": (lambda p: (p / ADAPTER_CONFIG).write_text("[1]"), "is not a JSON object"),
    "config_not_json": (lambda p: (p / ADAPTER_CONFIG).write_text("{"), "cannot read"),
    "rank_disagrees": (_edit_config(r=2), "lora_A.weight has shape [4, 192], expected [2, 192]"),
    "unexpected_tensor": (_edit_tensors(lambda t: t.__setitem__("base_model.model.model.norm.weight",
                                                               torch.ones(64))), "unexpected tensor"),
    "missing_b": (_edit_tensors(lambda t: t.pop(Q_B)), "has no lora_B.weight"),
    "unknown_module": (_edit_tensors(lambda t: t.update(
        {k.replace("layers.0.", "layers.9."): v.clone() for k, v in t.items()})), "targets model.layers.9."),
    "tied_module": (_edit_tensors(lambda t: t.update({
        "base_model.model.model.embed_tokens.lora_A.weight": torch.zeros(4, 64),
        "base_model.model.model.embed_tokens.lora_B.weight": torch.zeros(99, 4)})), "not an untied linear layer"),
    "wrong_shape": (_edit_tensors(lambda t: t.__setitem__(Q_A, torch.zeros(4, 65))), "expected [4, 64]"),
    "wrong_dtype": (_edit_tensors(lambda t: t.__setitem__(Q_A, t[Q_A].double())), "has dtype F64"),
    "nan": (_edit_tensors(_poison), "holds NaN or infinite values"),
    "merged_overflows": (lambda p: (_edit_config(lora_alpha=1e10)(p), _edit_tensors(  # finite A, B and alpha
        lambda t: t.__setitem__(Q_B, torch.full_like(t[Q_B], 1e30)))(p)), "would not be finite in the served dtype"),
    "no_tensors": (_edit_tensors(lambda t: t.clear()), "holds no LoRA tensors"),
    "saved_not_a_list": (_edit_config(modules_to_save="norm"), "modules_to_save must be a list of module names"),
    "saved_huge": (_edit_config(modules_to_save={"x": "y" * 100_000}), "modules_to_save must be a list"),
    "rank_huge": (_edit_config(r=[1] * 100_000), "r must be an integer >= 1"),
    "saved_wrong_shape": (lambda p: (_edit_config(modules_to_save=["norm"])(p), _edit_tensors(lambda t: t.__setitem__(
        NORM, torch.ones(65)))(p)), "saved model.norm.weight has shape [65], the served model's is [64]"),
    "saved_unknown": (lambda p: (_edit_config(modules_to_save=["norm"])(p), _edit_tensors(lambda t: t.__setitem__(
        NORM.replace("model.norm", "model.layers.9.input_layernorm"), torch.ones(64)))(p)), "not an untied weight"),
    "saved_tied": (lambda p: (_edit_config(modules_to_save=["embed_tokens"])(p), _edit_tensors(lambda t: t.__setitem__(
        "base_model.model.model.embed_tokens.weight", torch.ones(3, 64)))(p)), "not an untied weight"),
    "saved_and_adapted": (lambda p: (_edit_config(modules_to_save=["q_proj"])(p), _edit_tensors(lambda t: t.__setitem__(
        Q_A.replace(".lora_A", ""), torch.ones(192, 64)))(p)), "is both adapted (lora_A/lora_B) and saved in full"),
    "saved_nan": (lambda p: (_edit_config(modules_to_save=["norm"])(p), _edit_tensors(lambda t: t.__setitem__(
        NORM, torch.full((64,), float("nan"))))(p)), "holds NaN or infinite values"),
    "corrupt_file": (lambda p: (p / ADAPTER_WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{"), "cannot read"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_adapter_is_refused_in_one_line_and_nothing_changes(engine, tiny_model_dir, tmp_path, name):
    edit, words = BROKEN[name]
    path = write_adapter(tiny_model_dir, tmp_path, rank=4, alpha=8.0)
    edit(path)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    step = engine.weight_step
    with pytest.raises(UserError) as caught:
        engine.stage_weights(str(path))  # the app answers 400 with this message; apply never runs
    assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    assert len(str(caught.value)) < 300 + len(str(path)), len(str(caught.value))  # hostile values are cut short
    assert engine.weight_step == step
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())


def test_without_a_reference_the_shapes_are_checked_among_themselves(tiny_model_dir, tmp_path):
    path = write_adapter(tiny_model_dir, tmp_path, rank=4)
    assert verify_adapter_dir(path, None, keep=False).rank == 4
    _edit_tensors(lambda t: t.__setitem__(Q_B, torch.zeros(64, 3)))(path)
    with pytest.raises(UserError, match="lora_B.weight has shape \\[64, 3\\], expected \\[64, 4\\]"):
        verify_adapter_dir(path, None, keep=False)


@pytest.mark.parametrize("name, missing", [(ADAPTER_CONFIG, "is not a weight directory"),
                                           (ADAPTER_WEIGHTS, f"adapter directory without {ADAPTER_WEIGHTS}")])
def test_adapter_files_follow_the_weight_dir_rules(tiny_model_dir, tmp_path, name, missing):
    root = tmp_path / "weights"
    path = write_adapter(tiny_model_dir, tmp_path)
    assert check_weight_dir(path, None, (root,)) == (path, 1)
    secret = tmp_path / "elsewhere" / name
    secret.parent.mkdir()
    secret.write_bytes((path / name).read_bytes())
    (path / name).unlink()
    (path / name).symlink_to(secret)
    with pytest.raises(WeightPathForbidden, match="outside the allowed"):
        check_weight_dir(path, None, (root,))
    (path / name).unlink()
    with pytest.raises(UserError, match=missing):
        check_weight_dir(path, None, (root,))
    os.mkfifo(path / name)
    with pytest.raises(UserError, match="is not a regular file"):
        check_weight_dir(path, None, (root,))

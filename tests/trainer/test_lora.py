"""LoRA in the trainer: config rules, seeded injection, the adapter directory it writes (loads with peft),
merged weights, checkpoint identity checks, and the scale alpha / r."""

from __future__ import annotations

import json

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from prime_rl.configs.cli import parse_config
from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, lora_delta, lora_scale
from prime_rl.trainer.config import LoRAConfig, TrainerConfig
from prime_rl.trainer.dist import init_distributed
from prime_rl.trainer.lora import apply_lora, check_resume, checkpoint_identity
from prime_rl.trainer.publish_weights import write_weights
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import list_steps
from tests.support.lora_adapters import logits, lora_model

IDS = [5, 17, 30, 2, 44, 61, 9]


@pytest.mark.parametrize("flag, value, words", [
    ("--lora.rank", "0", "lora.rank"),
    ("--lora.alpha", "0", "lora.alpha"),
    ("--lora.dropout", "1.0", "lora.dropout"),
    ("--lora.target-modules", "[]", "lora.target_modules"),
    ("--lora.target-modules", '[""]', "lora.target_modules"),
    ("--lora.modules-to-save", '[""]', "lora.modules_to_save"),
])
def test_bad_lora_values_are_config_errors(flag, value, words, capsys):
    with pytest.raises(SystemExit) as caught:
        parse_config(TrainerConfig, [flag, value])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err


def test_lora_is_off_by_default_and_a_section_turns_it_on():
    assert TrainerConfig.build([], {}).lora is None
    assert TrainerConfig.build([], {"lora": {}}).lora == LoRAConfig()


@pytest.mark.parametrize("targets, words", [
    (["nothing_like_this"], "not found in the base model"),
    (["q_proj", "nothing_like_this"], "'nothing_like_this' matches no linear layer"),
    (["embed_tokens"], "not a linear layer of a decoder layer"),
    (["lm_head"], "not a linear layer of a decoder layer"),
])
def test_targets_that_match_no_decoder_linear_are_user_errors(tiny_model_dir, targets, words):
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(UserError, match=words) as caught:
        apply_lora(net, LoRAConfig(target_modules=targets), seed=0)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("saved, words", [
    (["nothing_like_this"], "'nothing_like_this' matches no module"),
    (["q_proj"], "matches model.layers.0.self_attn.q_proj, which is part of a LoRA layer"),
    (["default"], "which is part of a LoRA layer"),  # peft's own lora_A.default: suffix match
    (["mlp"], "matches model.layers.0.mlp, which is not a layer with weights of its own"),
    (["embed_tokens"], "model.embed_tokens.weight is tied to lm_head.weight"),
])
def test_saved_modules_that_cannot_ship_with_the_adapter_are_user_errors(tiny_model_dir, saved, words):
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert net.config.tie_word_embeddings
    with pytest.raises(UserError, match=words) as caught:
        apply_lora(net, LoRAConfig(modules_to_save=saved), seed=0)
    assert "\n" not in str(caught.value)


def test_saved_modules_train_in_full_under_their_own_names(tiny_model_dir):
    net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    apply_lora(net, LoRAConfig(target_modules=["o_proj"], modules_to_save=["norm"]), seed=0)
    trainable = {name for name, p in net.named_parameters() if p.requires_grad}
    norms = {name for name in trainable if ".lora_" not in name}
    layers = net.config.num_hidden_layers
    # "norm" is every RMSNorm, as peft matches it: input/post-attention, q/k, and the final one.
    assert len(norms) == 4 * layers + 1 and "model.norm.weight" in norms, sorted(norms)
    assert all(name.endswith("norm.weight") for name in norms)
    assert len(trainable - norms) == 2 * layers  # o_proj's A and B


def test_injection_is_seeded_leaves_the_rng_alone_and_trains_only_the_adapters(tiny_model_dir):
    nets = []
    for _ in range(2):
        torch.manual_seed(123)
        net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        apply_lora(net, LoRAConfig(rank=4), seed=7)
        nets.append(net)
    # The global RNG continues as if no adapter had been drawn.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), LoRAConfig(), seed=7)
    assert torch.equal(torch.rand(3), expected)
    a, b = (dict(n.named_parameters()) for n in nets)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    trainable = [name for name, p in a.items() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert all(torch.count_nonzero(p) == 0 for n, p in a.items() if ".lora_B." in n)  # step 0 is the base model


@pytest.mark.parametrize("rank, alpha", [(4, 16.0), (1, 1.0), (200, 8.0)])  # 200 > every dimension (64, 128)
@pytest.mark.slow
def test_the_adapter_dir_loads_with_peft_and_computes_the_trainers_model(tiny_model_dir, tmp_path, rank, alpha):
    peft_model, net, weights = lora_model(tiny_model_dir, rank=rank, alpha=alpha)
    assert weights.scale == alpha / rank == lora_scale(rank, alpha)
    path = write_weights(net, build_char_tokenizer(), tmp_path, 1, is_main=True, lora=weights)
    assert {ADAPTER_CONFIG, ADAPTER_WEIGHTS, "tokenizer.json"} <= {p.name for p in path.iterdir()}
    assert not (path / "config.json").exists()  # not a full-weights directory
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base_logits = logits(plain, IDS)
    loaded = PeftModel.from_pretrained(plain, path).eval()
    torch.testing.assert_close(logits(loaded, IDS), logits(peft_model, IDS), atol=0, rtol=0)
    assert not torch.allclose(logits(loaded, IDS), base_logits, atol=1e-3)  # the adapter does change the model


def test_saved_modules_ship_in_the_adapter_dir_and_load_with_peft(tiny_model_dir, tmp_path):
    peft_model, net, weights = lora_model(tiny_model_dir, rank=4, alpha=8.0, modules_to_save=["norm"])
    path = write_weights(net, build_char_tokenizer(), tmp_path, 1, is_main=True, lora=weights)
    assert json.loads((path / ADAPTER_CONFIG).read_text())["modules_to_save"] == ["norm"]
    assert "base_model.model.model.norm.weight" in load_file(path / ADAPTER_WEIGHTS)
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(plain, path).eval()
    torch.testing.assert_close(logits(loaded, IDS), logits(peft_model, IDS), atol=0, rtol=0)
    # Without the saved norms the adapter alone computes something else.
    without = lora_model(tiny_model_dir, rank=4, alpha=8.0)[0]
    assert not torch.allclose(logits(without, IDS), logits(peft_model, IDS), atol=1e-3)


def test_merge_publishes_full_weights_equal_to_w0_plus_scaled_b_a(tiny_model_dir, tmp_path):
    init_distributed()  # merged weights are gathered with get_model_state_dict, a collective
    peft_model, net, weights = lora_model(tiny_model_dir, rank=4, alpha=8.0, merge=True, modules_to_save=["norm"])
    path = write_weights(net, build_char_tokenizer(), tmp_path, 1, is_main=True, lora=weights)
    assert (path / "config.json").exists() and not (path / ADAPTER_CONFIG).exists()
    merged = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    layer = dict(net.named_modules())["model.layers.1.mlp.down_proj"]
    expected = base["model.layers.1.mlp.down_proj.weight"] + 2.0 * layer.lora_B["default"].weight @ layer.lora_A[
        "default"].weight
    torch.testing.assert_close(merged.state_dict()["model.layers.1.mlp.down_proj.weight"], expected)
    trained_norm = dict(net.named_parameters())["model.norm.weight"]  # a saved module: its trained value
    torch.testing.assert_close(merged.state_dict()["model.norm.weight"], trained_norm, atol=0, rtol=0)
    assert not torch.equal(trained_norm, base["model.norm.weight"])
    embed = "model.embed_tokens.weight"  # neither adapted nor saved: the base's
    torch.testing.assert_close(merged.state_dict()[embed], base[embed], atol=0, rtol=0)
    torch.testing.assert_close(logits(merged, IDS), logits(peft_model, IDS), atol=1e-5, rtol=1e-5)


def test_keep_weights_prunes_adapter_dirs(tiny_model_dir, tmp_path):
    _, net, weights = lora_model(tiny_model_dir, rank=2)
    for step in range(1, 5):
        write_weights(net, build_char_tokenizer(), tmp_path, step, is_main=True, keep=2, lora=weights)
    assert list_steps(tmp_path / "weights") == [3, 4]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step_3", "step_4"]


def test_lora_delta_is_scaled_b_times_a():
    a, b = torch.randn(3, 5), torch.randn(7, 3)
    torch.testing.assert_close(lora_delta(a, b, 0.5), 0.5 * b @ a)
    assert lora_delta(a.bfloat16(), b.bfloat16(), 1.0).dtype == torch.float32
    assert lora_scale(16, 8.0, rslora=True) == 2.0


FULL = checkpoint_identity(None, None)
LORA = checkpoint_identity(LoRAConfig(rank=8), [10.0, 20.0])


@pytest.mark.parametrize("saved, current, words", [
    (FULL, LORA, "trained without LoRA"),
    (LORA, FULL, "holds LoRA adapters \\(rank 8\\) but this run has no \\[lora\\]"),
    (LORA, checkpoint_identity(LoRAConfig(rank=4), [10.0, 20.0]), "lora.rank = 8, this run has 4"),
    (LORA, checkpoint_identity(LoRAConfig(rank=8, alpha=1.0), [10.0, 20.0]), "lora.alpha"),
    (LORA, checkpoint_identity(LoRAConfig(rank=8, target_modules=["q_proj"]), [10.0, 20.0]), "lora.target_modules"),
    (LORA, checkpoint_identity(LoRAConfig(rank=8), [10.0, 20.5]), "other base weights"),
    (LORA, checkpoint_identity(LoRAConfig(rank=8, merge=True), [10.0, 20.0]), "lora.merge = False, this run has True"),
    (LORA, checkpoint_identity(LoRAConfig(rank=8, modules_to_save=["norm"]), [10.0, 20.0]),
     "lora.modules_to_save = \\[\\], this run has \\['norm'\\]"),
])
def test_resume_into_another_model_is_one_line(saved, current, words):
    with pytest.raises(UserError, match=words) as caught:
        check_resume(saved, current, "ckpt")
    assert "\n" not in str(caught.value)


def test_resume_into_the_same_model_passes():
    check_resume(FULL, FULL, "ckpt")
    check_resume({}, FULL, "ckpt")  # a checkpoint from before LoRA existed
    check_resume(LORA, checkpoint_identity(LoRAConfig(rank=8, dropout=0.2), [10.0, 20.0 + 1e-12]), "c")
    before_saved_modules = {"lora": {k: v for k, v in LORA["lora"].items() if k != "modules_to_save"},
                            "base": LORA["base"]}
    check_resume(before_saved_modules, LORA, "c")  # a checkpoint from before modules_to_save existed

"""`sft` from a random-init config: the loss falls, weights load and generate, resume continues."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from prime_rl.run_dir import weights_dir
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.trainer.sft.train import main, train
from prime_rl.utils.fs import list_steps

TINY = {"tokenizer": "char", "overrides": {"hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64}}


def config(out: Path, **overrides) -> SFTConfig:
    base = {
        "output_dir": str(out),
        "init": TINY,
        "data": {"env": "reverse-text", "env_args": {"min_len": 3, "max_len": 6}},
        "max_steps": 8,
        "batch_size": 16,
        "seq_len": 128,
        "optim": {"lr": 3e-3},
        "wandb": {"mode": "disabled"},
        "runtime": {"deterministic": True},
    }
    base.update(overrides)
    return SFTConfig.build([], base)


def sft_metrics(out: Path) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["source"] == "sft"]


@pytest.mark.slow
def test_sft_from_scratch_learns_and_writes_loadable_weights(tmp_path):
    """8 steps from random weights lower the loss by more than 0.3: deterministic (seed 0, deterministic algorithms,
    the float kernels pinned by tests/conftest.py); the drop measured 0.613 at seed 0 (AVX2 and AVX-512 kernels alike)
    and 0.580 / 0.642 / 0.612 / 0.581 at seeds 1-4."""
    out = tmp_path / "sft"
    train(config(out, weights_interval=4, eval={"interval": 8, "num_examples": 4, "max_new_tokens": 8}))
    metrics = sft_metrics(out)
    losses = [m["loss/sft"] for m in metrics]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < losses[0] - 0.3, losses
    for key in ("optim/lr", "optim/grad_norm", "perf/tokens_per_s", "perf/step_time_s"):
        assert key in metrics[-1]
    assert 0.0 <= metrics[-1]["eval/reward"] <= 1.0
    assert list_steps(out / "weights") == [4, 8]

    path = weights_dir(out, 8)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    prompt = tok.apply_chat_template([{"role": "user", "content": "abc"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    generated = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > ids.shape[1]


@pytest.mark.slow
def test_sft_resume_continues_identically(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    sched = {"scheduler": {"type": "constant", "warmup_steps": 3}}  # the lr does not depend on max_steps
    train(config(straight, max_steps=4, **sched))
    train(config(resumed, max_steps=2, **sched))  # ends with a checkpoint at step 2
    assert list_steps(resumed / "checkpoints") == [2]
    train(config(resumed, max_steps=4, ckpt={"resume_step": "latest"}, **sched))
    a = load_file(weights_dir(straight, 4) / "model.safetensors")
    b = load_file(weights_dir(resumed, 4) / "model.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=0, rtol=0, msg=key)
    assert [m["step"] for m in sft_metrics(resumed)] == [0, 1, 2, 3]


def test_sft_on_jsonl(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": w, "completion": w[::-1]}) for w in ["abc", "hello", "xyz"]))
    out = tmp_path / "jsonl"
    train(config(out, data={"path": str(data)}, max_steps=2, batch_size=4))
    assert list_steps(out / "weights") == [2]


def test_bad_config_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--data.path", str(tmp_path / "x.jsonl"), "--data.env", "reverse-text", "--output-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "exactly one" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--data.env", "no-such-env", "--init.tokenizer", "char", "--output-dir", str(tmp_path / "o"),
              "--wandb.mode", "disabled"])
    assert exc.value.code == 2
    # With the verifiers extra installed an unknown id is looked up there first.
    has_verifiers = importlib.util.find_spec("verifiers") is not None
    assert ("cannot load verifiers environment" if has_verifiers else "unknown environment") in capsys.readouterr().err

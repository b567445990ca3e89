"""LoRA end to end: `rl` with adapter updates stays exactly on-policy on the builtin server (also with
dropout set and trained norms, and with merged weights), and `sft` trains adapters."""

from __future__ import annotations

import json
import math

import pytest
from peft import PeftModel
from transformers import AutoModelForCausalLM

from prime_rl.models.embedded import EMBEDDED_MODELS
from prime_rl.models.lora_adapter import ADAPTER_CONFIG
from prime_rl.run_dir import weights_dir
from prime_rl.trainer.sft.train import main as sft_main
from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]

LORA = "[trainer.lora]\nrank = 4\n[trainer.optim]\nlr = 1e-2\n"  # a large lr: the adapters change every step


@pytest.mark.parametrize("table, kind", [
    # Dropout is set but the RL trainer runs with dropout off: its logprobs are the sampling policy's.
    # The trained RMSNorm gains (modules_to_save) ship in the adapter and are served too.
    (LORA.replace("rank = 4\n", 'rank = 4\ndropout = 0.2\nmodules_to_save = ["norm"]\n'), ADAPTER_CONFIG),
    (LORA.replace("rank = 4\n", "rank = 4\nmerge = true\n"), "model.safetensors"),
], ids=["adapter_with_dropout", "merged"])
def test_lora_runs_stay_on_policy_after_several_updates(tmp_path, table, kind):
    """max_async_level 0, fp32, builtin: mismatch KL < 1e-6 at every step (asserted by the helper), so the
    server's merged W0 + (alpha / r) B A computes what the trainer's peft layers compute, after 3 updates."""
    run = on_policy_run(tmp_path, table, seq_len=256, max_tokens=8)
    trainer = run.rows("trainer")
    assert all(math.isfinite(row["optim/grad_norm"]) and row["optim/grad_norm"] > 0 for row in trainer.values())
    published = weights_dir(tmp_path / "run", 3)
    assert (published / kind).exists(), sorted(p.name for p in published.iterdir())


def test_sft_with_lora_trains_adapters_that_load_with_peft(tmp_path):
    out = tmp_path / "sft"
    sft_main(["--model.name", "tiny-reverse-text", "--output-dir", str(out), "--max-steps", "3", "--batch-size", "8",
              "--lora.rank", "4", "--lora.dropout", "0.1", "--lora.target-modules", '["q_proj", "v_proj"]',
              "--wandb.mode", "disabled"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 1, 2] and all(math.isfinite(row["loss/sft"]) for row in rows)
    base = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODELS["tiny-reverse-text"])
    model = PeftModel.from_pretrained(base, weights_dir(out, 3))
    trained = [p for name, p in model.named_parameters() if ".lora_B." in name]
    assert len(trained) == 2 * base.config.num_hidden_layers and any(p.abs().sum() > 0 for p in trained)

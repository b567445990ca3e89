"""LoRA models and adapter directories for tests: a tiny model with peft's adapters injected (B made
non-zero so the adapter changes something), written by the trainer's own `write_weights`.

`tests/` is on sys.path (rootdir conftest), so tests import this as `lora_adapters`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.trainer.config import LoRAConfig
from prime_rl.trainer.lora import LoRAWeights, apply_lora
from prime_rl.trainer.publish_weights import write_weights


def lora_model(model_dir: Path, seed: int = 0, **lora):
    """(PeftModel, the injected HF model, LoRAWeights) on `model_dir`, fp32, eval mode, B ~ N(0, 0.1^2)
    drawn from `seed` (at init B is 0 and the adapter would be the identity), and each weight of the
    `modules_to_save` (trainable, not an adapter) plus N(0, 0.1^2)."""
    config = LoRAConfig(**lora)
    net = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    peft_model = apply_lora(net, config, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            elif param.requires_grad and ".lora_A." not in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return peft_model, net, LoRAWeights.of(peft_model, config)


def write_adapter(model_dir: Path, output_dir: Path, step: int = 1, seed: int = 0, **lora) -> Path:
    """weights/step_`step` of a random adapter (see `lora_model`) under `output_dir`, as the trainer writes it."""
    _, net, weights = lora_model(model_dir, seed, **lora)
    return write_weights(net, build_char_tokenizer(), output_dir, step, is_main=True, lora=weights)


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]

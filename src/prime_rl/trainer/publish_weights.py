"""`weights/step_N/`: HF-format weights (safetensors, config, generation config, tokenizer), or with
LoRA a peft adapter directory (adapter_config.json, adapter_model.safetensors, tokenizer).

All ranks gather the full state dict (a collective; with LoRA only the adapters, unless merged);
rank 0 writes it into a temporary directory and renames it into place, then prunes old steps.
With weight_transfer.mode = "distributed" rank 0 broadcasts it to the servers instead and writes
only the marker `transfer.json` (`send_weights`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import GenerationConfig, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from prime_rl.run_dir import weights_dir
from prime_rl.trainer.lora import LoRAWeights, gather_adapter, merged_state
from prime_rl.utils.fs import atomic_dir, prune_steps
from prime_rl.weight_transfer import send, write_marker


def write_weights(model: nn.Module, tokenizer: PreTrainedTokenizerBase, output_dir: Path, step: int,
                  is_main: bool, keep: int | None = None, lora: LoRAWeights | None = None) -> Path:
    """Collective: every rank must call it. Returns the weight directory (complete on rank 0's return).

    With `lora` (not merged) the directory is the adapter, loadable with `PeftModel.from_pretrained`."""
    target = weights_dir(output_dir, step)
    if lora is not None and not lora.merge:
        adapter = gather_adapter(model)
        if is_main:
            with atomic_dir(target) as tmp:
                lora.save_adapter(tmp, adapter)
                tokenizer.save_pretrained(tmp)
            prune_steps(target.parent, keep)
        return target
    state = full_state(model, lora)
    if is_main:
        hf_logging.disable_progress_bar()  # a "Writing model shards" bar per step floods the log
        with atomic_dir(target) as tmp:
            model.save_pretrained(tmp, state_dict=state, max_shard_size="5GB")
            generation = getattr(model, "generation_config", None)
            if generation is None:
                generation = GenerationConfig.from_model_config(model.config)
            generation.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        prune_steps(target.parent, keep)
    return target


def full_state(model: nn.Module, lora: LoRAWeights | None = None) -> dict[str, torch.Tensor]:
    """Collective: the full state dict on CPU (every rank gets it; with merged LoRA, the plain model's)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return merged_state(state, lora.scale) if lora is not None else state


def send_weights(model: nn.Module, group, output_dir: Path, step: int, is_main: bool, device: torch.device,
                 keep: int | None = None, lora: LoRAWeights | None = None) -> Path:
    """Collective (weight_transfer.mode = "distributed"): gather the full state, rank 0 broadcasts it to the
    inference servers over `group` (`weight_transfer`), then writes the marker weights/step_N/transfer.json
    (atomically; the orchestrator's sign that step N can be loaded) and prunes old markers."""
    state = full_state(model, lora)
    target = weights_dir(output_dir, step)
    if is_main:
        send(group, step, state, device)
        with atomic_dir(target) as tmp:
            write_marker(tmp, step)
        prune_steps(target.parent, keep)
    return target

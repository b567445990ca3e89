"""`weights/step_N/`: HF-format weights (safetensors, config, generation config, tokenizer), or with
LoRA a peft adapter directory (adapter_config.json, adapter_model.safetensors, tokenizer).

All ranks gather the full state dict (a collective; with LoRA only the adapters, unless merged);
rank 0 writes it into a temporary directory and renames it into place, then prunes old steps.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import GenerationConfig, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from prime_rl.run_dir import weights_dir
from prime_rl.trainer.lora import LoRAWeights, gather_adapter, merged_state
from prime_rl.utils.fs import atomic_dir, prune_steps


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
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if lora is not None:
        state = merged_state(state, lora.scale)
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

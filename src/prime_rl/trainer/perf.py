"""Throughput figures: tokens/s, model FLOPs utilisation (GPU only), peak memory."""

from __future__ import annotations

import resource

import torch
import torch.nn as nn

# Dense bf16 peak FLOP/s per device (no sparsity), by a substring of the device name.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def num_parameters(model: nn.Module) -> int:
    """Parameters of the full model (DTensor shards count with their global size)."""
    return sum(p.numel() for p in model.parameters())


def flops_per_token(num_params: int, config, seq_len: float) -> float:
    """Training FLOPs per token: 6 N (forward + backward of the weights) + 12 L H s (attention scores
    and values over an average context of s tokens, forward + backward)."""
    layers = getattr(config, "num_hidden_layers", 0)
    heads = getattr(config, "num_attention_heads", 0)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // max(heads, 1)
    return 6.0 * num_params + 12.0 * layers * heads * head_dim * seq_len


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def peak_memory_gib(device: torch.device) -> float:
    """Peak allocated GPU memory, or this process's peak resident memory on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def throughput_metrics(tokens: int, step_time: float, model_flops_per_token: float, world_size: int,
                       device: torch.device) -> dict[str, float]:
    """perf/* metrics of one step; `tokens` counts all ranks."""
    metrics = {
        "perf/tokens_per_s": tokens / step_time,
        "perf/step_time_s": step_time,
        "perf/peak_memory_gib": peak_memory_gib(device),
    }
    peak = peak_flops(device)
    if peak is not None:
        metrics["perf/mfu"] = tokens * model_flops_per_token / step_time / (peak * world_size)
    return metrics

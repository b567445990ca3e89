"""How many CUDA devices this machine has, asked of torch only where a GPU driver is loaded.

The launcher plans a run (which devices each process gets, which inference backend `auto` means) before it starts
anything; importing torch for that costs every `rl` start, `--help` and `--dry-run` ~2.5 s on a CPU-only machine.
On Linux a CUDA device needs the NVIDIA driver (`/proc/driver/nvidia`) or, for torch's ROCm builds, the AMD
driver (`/dev/kfd`): without either the count is 0 and torch is not imported. Elsewhere torch is always asked.
"""

from __future__ import annotations

import os
import sys

GPU_DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/kfd")


def cuda_device_count() -> int:
    """`torch.cuda.device_count()`; 0 without importing torch on a Linux machine with no GPU driver loaded."""
    if sys.platform == "linux" and not any(os.path.exists(path) for path in GPU_DRIVER_PATHS):
        return 0
    import torch

    return torch.cuda.device_count()

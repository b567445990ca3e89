"""`cuda_device_count`: torch's count where a GPU driver is loaded, 0 without asking torch where none is."""

from __future__ import annotations

import sys

import pytest
import torch

from prime_rl.utils import devices


@pytest.mark.skipif(sys.platform != "linux", reason="the driver paths are Linux's")
def test_no_gpu_driver_means_no_device_and_torch_is_not_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(devices, "GPU_DRIVER_PATHS", (str(tmp_path / "no-nvidia"), str(tmp_path / "no-kfd")))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: pytest.fail("torch was asked"))
    assert devices.cuda_device_count() == 0


def test_with_a_gpu_driver_torch_counts_the_devices(monkeypatch, tmp_path):
    (tmp_path / "nvidia").mkdir()
    monkeypatch.setattr(devices, "GPU_DRIVER_PATHS", (str(tmp_path / "nvidia"),))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices.cuda_device_count() == 3

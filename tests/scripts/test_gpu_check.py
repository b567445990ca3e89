"""`scripts/gpu_check.sh` on a machine without a CUDA device: one line, exit 0, nothing written; and the `gpu`
tests it runs are collected by the normal suite (and skipped there without CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow  # servers or scripts in subprocesses

ROOT = REPO


def test_gpu_check_skips_cleanly_without_cuda(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "", "GPU_CHECK_DIR": str(tmp_path / "g")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("\n") == 1 and "no CUDA device visible" in result.stdout, result.stdout
    assert not (tmp_path / "g").exists()


def test_the_gpu_tests_are_collected_and_skipped_without_cuda():
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "gpu", "-p", "no:cacheprovider",
                             str(ROOT / "tests" / "test_gpu.py")],
                            capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "4 skipped" in result.stdout and "passed" not in result.stdout.splitlines()[-1], result.stdout[-2000:]


def test_gpu_check_without_a_working_python_is_an_error_not_a_skip(tmp_path):
    env = os.environ | {"PYTHON": str(tmp_path / "no-python"), "GPU_CHECK_DIR": str(tmp_path / "g")}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 1 and "cannot import torch" in result.stderr, result.stdout + result.stderr

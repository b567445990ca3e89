"""`inference` entrypoint: an OpenAI-compatible server with live weight updates.

    inference --model.name <dir> --backend builtin --port 8000 [@ file.toml]

`builtin` serves with the embedded torch engine in this process; `vllm` hands this
process over to vLLM's OpenAI server (with prime-rl's routes); `auto` picks vllm when it
is importable and a GPU is present (`inference/backends.py`). See docs/inference.md.
"""

from __future__ import annotations

from prime_rl.configs.cli import run_main
from prime_rl.inference.backends import serve
from prime_rl.inference.config import InferenceConfig


def main(argv: list[str] | None = None) -> None:
    run_main(InferenceConfig, serve, argv)


if __name__ == "__main__":  # `python -m prime_rl.inference.server`, for venvs without the console script
    main()

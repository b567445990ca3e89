"""`inference` entrypoint (not implemented yet: it validates its config and says so)."""

from __future__ import annotations

from prime_rl.configs.cli import fail, parse_config
from prime_rl.inference.config import InferenceConfig


def main(argv: list[str] | None = None) -> None:
    parse_config(InferenceConfig, argv)
    fail("the inference is not implemented yet (use --dry-run to check a config)", 3)

"""`rl`: one command for an RL run (inference server + orchestrator + trainer)."""

from __future__ import annotations

from prime_rl.configs.cli import fail, parse_config
from prime_rl.configs.rl import RLConfig


def main(argv: list[str] | None = None) -> None:
    parse_config(RLConfig, argv)
    fail("the rl launcher is not implemented yet (use --dry-run to check a config)", 3)

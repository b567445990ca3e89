"""`trainer` entrypoint (not implemented yet: it validates its config and says so)."""

from __future__ import annotations

from prime_rl.configs.cli import fail, parse_config
from prime_rl.trainer.config import TrainerConfig


def main(argv: list[str] | None = None) -> None:
    parse_config(TrainerConfig, argv)
    fail("the trainer is not implemented yet (use --dry-run to check a config)", 3)

"""`orchestrator` entrypoint (not implemented yet: it validates its config and says so)."""

from __future__ import annotations

from prime_rl.configs.cli import fail, parse_config
from prime_rl.orchestrator.config import OrchestratorConfig


def main(argv: list[str] | None = None) -> None:
    parse_config(OrchestratorConfig, argv)
    fail("the orchestrator is not implemented yet (use --dry-run to check a config)", 3)

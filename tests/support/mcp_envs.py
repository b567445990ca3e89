"""A tool environment whose tools come from an MCP server (`tests/support/mcp_calculator_server.py`): the
calculator's examples and scoring."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prime_rl.envs.calculator import CalculatorEnv
from prime_rl.envs.tools import ToolEnvironment

SERVER = [sys.executable, str(Path(__file__).with_name("mcp_calculator_server.py"))]


class McpCalculator(ToolEnvironment):
    id = "mcp-calculator"

    def __init__(self, mcp_servers: list | None = None, tool_timeout_s: float = 5.0):
        super().__init__(max_turns=3, tool_timeout_s=tool_timeout_s, mcp_servers=mcp_servers or [SERVER])
        self.task = CalculatorEnv()

    def tool_functions(self) -> list[Any]:
        return []

    def examples(self, seed: int = 0):
        return self.task.examples(seed)

    async def score_rollout(self, example, rollout):
        return await self.task.score_rollout(example, rollout)

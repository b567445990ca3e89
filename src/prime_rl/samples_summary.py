"""A step's rollouts in a few columns, for reading at a glance: the rows `rl` prints on its console and the
orchestrator logs to W&B as a table (`[orchestrator.samples] console_rows`, `wandb_interval`), both made from the
lines of `rollouts/step_N/samples.jsonl` (written by `orchestrator/samples_log.py`), so what is shown is what is
on disk.

Columns: step, env, group, rollout, prompt (the text of the prompt's last user message), completion (the last turn
as sampled), reward, advantage (null: the group was dropped), finish_reason, error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prime_rl.run_dir import rollout_dir, samples_file

COLUMNS = ("step", "env", "group", "rollout", "prompt", "completion", "reward", "advantage", "finish_reason", "error")


def summary_row(record: dict[str, Any]) -> list[Any]:
    """One rollout line of samples.jsonl as COLUMNS."""
    users = [m.get("content") for m in record.get("prompt") or [] if isinstance(m, dict) and m.get("role") == "user"]
    prompt = users[-1] if users else ""
    return [record.get("step"), record.get("env"), record.get("group"), record.get("rollout"),
            prompt if isinstance(prompt, str) else json.dumps(prompt), record.get("completion", ""),
            record.get("reward"), record.get("advantage"), record.get("finish_reason"), record.get("error")]


def summary_rows(lines: Iterable[bytes | str], limit: int | None = None) -> list[list[Any]]:
    """The rollouts of samples.jsonl `lines` (not its `left_out` line) as rows, the first `limit` of them."""
    rows = []
    for line in lines:
        record = json.loads(line)
        if "left_out" in record:
            continue
        rows.append(summary_row(record))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def step_rows(output_dir: Path, step: int, limit: int) -> list[list[Any]]:
    """The first `limit` rollouts of step `step` as written in the run directory ([] when the step wrote none)."""
    path = samples_file(rollout_dir(output_dir, step))
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return summary_rows(f, limit)

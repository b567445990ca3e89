"""`rl @ examples/reverse_text/rl.toml`, shortened: the reward goes up and the loss metrics are logged.

The full example (and its measured gain) is in examples/reverse_text/README.md; this runs
its first steps on the embedded model with the example's own settings, so it checks the
shipped config and model as a user gets them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wandb_records import history  # tests/ is on sys.path (rootdir conftest)

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = 20
MIN_GAIN = 0.03  # measured: +0.065 after 20 steps (the full 80-step run gains more, see the README)
LOSS_KEYS = ("loss/importance_ratio", "loss/soft_gate_weight")


def rows_by_source(run_dir: Path, source: str) -> dict[int, dict]:
    """The last metrics.jsonl line of each step logged by `source`."""
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["source"] == source:
            rows[row["step"]] = row
    return rows


def test_reverse_text_example_learns_and_logs_loss_metrics_every_step(tmp_path):
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    result = subprocess.run(
        [sys.executable, "-m", "prime_rl.launch.rl", "@", str(REPO / "examples/reverse_text/rl.toml"),
         "--output-dir", str(run_dir), "--max-steps", str(STEPS), "--wandb.mode", "offline"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "mean of last 5" in result.stdout

    rewards = rows_by_source(run_dir, "orchestrator")
    assert sorted(rewards) == list(range(STEPS))
    first = rewards[0]["reward/mean"]
    last5 = sum(rewards[s]["reward/mean"] for s in range(STEPS - 5, STEPS)) / 5
    assert last5 >= first + MIN_GAIN, [round(rewards[s]["reward/mean"], 3) for s in range(STEPS)]

    trainer = rows_by_source(run_dir, "trainer")
    assert sorted(trainer) == list(range(STEPS))
    for step, row in trainer.items():
        for key in LOSS_KEYS:
            assert math.isfinite(row[key]), (step, key, row.get(key))

    wandb_rows = [row for run_file in (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
                  for row in history(run_file) if LOSS_KEYS[0] in row]
    assert sorted(row["_step"] for row in wandb_rows) == list(range(STEPS))
    for row in wandb_rows:
        assert all(math.isfinite(row[key]) for key in LOSS_KEYS), row

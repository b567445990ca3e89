"""The installed console scripts: help, dry-run with precedence, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(command: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")} | (env or {})
    return subprocess.run([str(BIN / command), *args], capture_output=True, text=True, timeout=120, env=full_env)


def test_rl_help_shows_nested_keys():
    result = run("rl", "--help")
    assert result.returncode == 0
    assert "--loss.type" in result.stdout and "--trainer.optim.lr" in result.stdout


def test_rl_dry_run_merges_files_env_and_cli(tmp_path):
    (tmp_path / "a.toml").write_text("max_steps = 3\nseq_len = 300\n[trainer.optim]\nlr = 1e-3\n")
    (tmp_path / "b.toml").write_text("seq_len = 400\n")
    result = run(
        "rl", "@", str(tmp_path / "a.toml"), "@", str(tmp_path / "b.toml"), "--max-steps", "7", "--dry-run",
        env={"PRIME_TRAINER__OPTIM__LR": "2e-3", "PRIME_MAX_STEPS": "5"},
    )
    assert result.returncode == 0, result.stderr
    config = tomllib.loads(result.stdout)
    assert config["max_steps"] == 7 and config["seq_len"] == 400
    assert config["trainer"]["optim"]["lr"] == 2e-3


@pytest.mark.parametrize("command", ["rl", "trainer", "orchestrator", "inference", "sft"])
def test_bad_toml_exits_2_with_one_line(tmp_path, command):
    bad = tmp_path / "bad.toml"
    bad.write_text("not_a_key = 1\n")
    result = run(command, "@", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "unknown config key 'not_a_key'" in result.stderr
    assert "Traceback" not in result.stderr

"""The entrypoints: help, dry-run with precedence, and one-line errors.

Each command's `main(argv)` runs in the test's process (what its console script calls, checked against the
installed entry points); one test runs an installed script itself."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.support.entrypoints import MAINS
from tests.support.entrypoints import run_entrypoint as run

BIN = Path(sys.executable).parent
def test_every_console_script_calls_the_main_tested_here():
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts") if ep.name in MAINS}
    assert scripts == MAINS
    assert all((BIN / name).exists() for name in MAINS)


@pytest.mark.slow  # two subprocesses
def test_an_installed_script_shows_help_and_fails_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRIME_")}
    shown = subprocess.run([str(BIN / "rl"), "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert shown.returncode == 0 and "--loss.type" in shown.stdout, shown.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("not_a_key = 1\n")
    failed = subprocess.run([str(BIN / "rl"), "@", str(bad)], capture_output=True, text=True, timeout=120, env=env)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith(f"error: {bad}: unknown config key 'not_a_key'"), failed.stderr


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


def assert_one_line_exit_2(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and expected in result.stderr


@pytest.mark.parametrize(("command", "key"), [("rl", "max-steps"), ("trainer", "max-steps"),
                                              ("orchestrator", "max-steps"), ("inference", "port"),
                                              ("sft", "max-steps")])
def test_an_int_flag_without_value_is_an_error_in_every_entrypoint(command, key):
    assert_one_line_exit_2(run(command, f"--{key}", "--dry-run"), f"option --{key} needs a value")


@pytest.mark.parametrize(("args", "expected"), [
    (["--max-steps", "true"], "invalid value for 'max_steps': true/false is only valid for on/off keys"),
    (["--trainer.optim.lr", "inf"], "invalid value for 'trainer.optim.lr': Input should be a finite number"),
    (["--inference.host", "999.1.1.1"], "invalid value for 'inference.host': '999.1.1.1' is not a valid IPv4 address"),
    (["--output-dir", "/proc/prime-rl-run"], "is on the kernel file system /proc"),
    (["--orchestrator.sampling.max-tokens", "4096"], "leaves no room for a prompt in the model's context of 512"),
])
def test_rl_load_errors_fail_dry_run_with_one_line(args, expected):
    assert_one_line_exit_2(run("rl", *args, "--dry-run"), expected)


def test_non_utf8_toml_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b"max_steps = 3 # \xff\n")
    assert_one_line_exit_2(run("rl", "@", str(bad), "--dry-run"), f"config file {bad} is not UTF-8 text")


def test_unknown_prime_variables(tmp_path):
    assert_one_line_exit_2(run("rl", "--dry-run", env={"PRIME_MAX_STEPZ": "3"}), "did you mean PRIME_MAX_STEPS?")
    result = run("rl", "--dry-run", env={"PRIME_FOO": "1"})
    assert result.returncode == 0
    assert result.stderr == "warning: ignoring environment variable PRIME_FOO: not a config key of rl\n"


def marked_run(out: Path) -> dict[Path, bytes]:
    """A previous rl run's files (with its marker) and a user's file; returns every file's bytes."""
    from prime_rl.launch.output_dir import mark

    for name in ("weights/step_1", "configs", "logs"):
        (out / name).mkdir(parents=True)
        (out / name / "x").write_text("run")
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "notes.md").write_text("mine")
    mark(out, "rl")
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("args", "expected"), [
    (["--trainer.optim.lr", "nan"], "invalid value for 'trainer.optim.lr'"),  # a config error
    (["--deployment.inference-gpu-ids", "[99]"], "deployment GPU ids"),  # a check of the launcher, before deleting
])
def test_overwrite_deletes_nothing_when_the_command_fails(tmp_path, args, expected):
    before = marked_run(tmp_path)
    assert_one_line_exit_2(run("rl", "--output-dir", str(tmp_path), "--overwrite", *args), expected)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_overwrite_with_dry_run_deletes_nothing(tmp_path):
    before = marked_run(tmp_path)
    assert run("rl", "--output-dir", str(tmp_path), "--overwrite", "--dry-run").returncode == 0
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_overwrite_refuses_a_folder_prime_rl_did_not_mark(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "my.log").write_text("mine")
    assert_one_line_exit_2(run("rl", "--output-dir", str(tmp_path), "--overwrite"), "no .prime-rl-run marker")
    assert (tmp_path / "logs" / "my.log").read_text() == "mine"

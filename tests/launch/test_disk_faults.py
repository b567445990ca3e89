"""A full disk and a read-only output directory in the middle of an `rl` run.

The run directory lives on a small tmpfs mounted in a private user + mount namespace
(`unshare -Urm`, no root needed where unprivileged user namespaces are allowed). The
fault is injected from inside that namespace after a few trained steps: a filler file
takes every free byte, or the tmpfs is remounted read-only. The run must stop with one
line naming the disk problem (no traceback); once the disk is fixed, resuming 'latest'
completes with every step in metrics.jsonl exactly once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.rl_runs import (
    complete_checkpoints,
    resume_and_check,
    small_run_config,
    start_rl,
    wait_for_trained_step,
)

pytestmark = [pytest.mark.slow]

DISK_SIZE = "40m"  # a 12-step run with two checkpoints kept needs about 8 MB


@dataclass
class PrivateDisk:
    """A tmpfs at `path`, seen only by processes started with `enter` (the test sees it under `view`)."""

    path: Path
    holder: subprocess.Popen

    @property
    def enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "-U", "-m", "--"]

    def view(self, path: Path) -> Path:
        """Where the test process reads `path` (inside the namespace) from."""
        return Path(f"/proc/{self.holder.pid}/root") / path.relative_to("/")

    def run(self, *command: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.enter, *command], capture_output=True, text=True, timeout=60)


@pytest.fixture
def private_disk(tmp_path) -> Iterator[PrivateDisk]:
    if not (shutil.which("unshare") and shutil.which("nsenter")):
        pytest.skip("needs unshare and nsenter (util-linux)")
    path = tmp_path / "disk"
    path.mkdir()
    mount = f"mount -t tmpfs -o size={DISK_SIZE} tmpfs {path} && echo mounted && exec sleep 3600"
    holder = subprocess.Popen(["unshare", "-Urm", "sh", "-c", mount], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    if holder.stdout.readline().strip() != b"mounted":
        holder.kill()
        pytest.skip("cannot mount a tmpfs in a user namespace here (unprivileged user namespaces disabled?)")
    try:
        yield PrivateDisk(path, holder)
    finally:
        holder.kill()
        holder.wait()


def test_a_full_disk_stops_the_run_with_one_line_and_resume_completes(private_disk, tmp_path, tiny_model_dir):
    disk = private_disk.path
    args = small_run_config(disk, tiny_model_dir, 12, "--ckpt.interval", "2", "--ckpt.keep", "2")
    run_view = private_disk.view(disk / "run")
    log = tmp_path / "rl.log"  # outside the faulty disk, as a terminal would be
    proc = start_rl(args, log, private_disk.enter)
    try:
        wait_for_trained_step(proc, run_view, 4, log)
        private_disk.run("dd", "if=/dev/zero", f"of={disk}/filler", "bs=1M")  # ends with ENOSPC, as it should
        assert proc.wait(timeout=120) == 1
    finally:
        proc.kill()
    output = log.read_text()
    line = one_error_line(output)
    expected = rf"error: (trainer|orchestrator) exited with code \d+: no space left on device: cannot write {disk}"
    assert re.match(expected, line), line

    private_disk.run("rm", f"{disk}/filler")
    saved = complete_checkpoints(run_view)
    assert saved, "the full disk left no complete checkpoint"
    resume_and_check(args, run_view, tmp_path / "rl_resume.log", 12, saved[-1], private_disk.enter)


def test_a_read_only_output_dir_is_one_line_and_nothing_starts(private_disk, tmp_path, tiny_model_dir):
    """(A tmpfs cannot become read-only while a run has files open for writing, so this is at start.)"""
    disk = private_disk.path
    assert private_disk.run("mount", "-o", "remount,ro", str(disk)).returncode == 0
    log = tmp_path / "rl.log"
    proc = start_rl(small_run_config(disk, tiny_model_dir, 2), log, private_disk.enter)
    try:
        assert proc.wait(timeout=120) not in (0, None)
    finally:
        proc.kill()
    output = log.read_text()
    assert f"cannot write {disk}" in one_error_line(output) and "read-only" in one_error_line(output), output


def one_error_line(output: str) -> str:
    """The only `error:` line of a command's output, which must have no traceback."""
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    return errors[0]

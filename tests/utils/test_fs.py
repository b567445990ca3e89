"""Atomic writes and bounded waits."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prime_rl.utils.fs import WaitTimeout, atomic_dir, atomic_write_text, remove_dir, wait_for_path


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "hello")
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_failed_atomic_dir_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "step_1") as tmp:
        (tmp / "half.pt").write_text("x")
        raise RuntimeError("crash mid-write")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_appears_complete(tmp_path):
    with atomic_dir(tmp_path / "step_1") as tmp:
        (tmp / "rank_0.pt").write_text("x")
        assert not (tmp_path / "step_1").exists()
    assert (tmp_path / "step_1" / "rank_0.pt").read_text() == "x"


def test_remove_dir_leaves_nothing_and_a_missing_dir_is_no_error(tmp_path):
    """Two processes pruning the same step: the second finds it gone."""
    (tmp_path / "step_1" / "sub").mkdir(parents=True)
    remove_dir(tmp_path / "step_1")
    remove_dir(tmp_path / "step_1")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_cannot_be_renamed_is_deleted_in_place(tmp_path, monkeypatch):
    """A full disk or a read-only parent refusing the rename must not keep retention from freeing space."""
    import errno
    import os

    (tmp_path / "step_1" / "sub").mkdir(parents=True)

    def refused(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", refused)
    remove_dir(tmp_path / "step_1")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replacing_a_directory_is_never_seen_half_deleted(tmp_path, monkeypatch):
    """The old directory is set aside, the new one renamed in, then the old one deleted: a process killed inside
    that deletion leaves the new `step_1` whole and the old one as a temporary, never a partial `step_1`."""
    with atomic_dir(tmp_path / "step_1") as tmp:
        (tmp / "a").write_text("old")
        (tmp / "b").write_text("old")
    real_rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        if Path(path).name.startswith(".step_1.") and (Path(path) / "a").exists():
            raise KeyboardInterrupt
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr("prime_rl.utils.fs.shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "step_1") as tmp:
        (tmp / "a").write_text("new")
    assert (tmp_path / "step_1" / "a").read_text() == "new"
    assert not (tmp_path / "step_1" / "b").exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "step_1"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".step_1.") and leftovers[0].endswith(".tmp")


def test_wait_times_out_naming_what(tmp_path):
    with pytest.raises(WaitTimeout, match="rollout batch"):
        wait_for_path(tmp_path / "never", timeout_s=0.1, what="rollout batch")

"""Atomic writes and bounded waits."""

from __future__ import annotations

import pytest

from prime_rl.utils.fs import WaitTimeout, atomic_dir, atomic_write_text, wait_for_path


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


def test_wait_times_out_naming_what(tmp_path):
    with pytest.raises(WaitTimeout, match="rollout batch"):
        wait_for_path(tmp_path / "never", timeout_s=0.1, what="rollout batch")

"""A full or read-only disk becomes one line, whichever library raised the error."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import pytest

from prime_rl.configs.cli import run_main
from prime_rl.configs.shared import RunConfig
from prime_rl.utils import disk
from prime_rl.utils.disk import as_disk_error, human_bytes


def fake_statvfs(free: int, read_only: bool = False):
    def statvfs(_path):
        return SimpleNamespace(f_bavail=free // 4096, f_frsize=4096, f_flag=os.ST_RDONLY if read_only else 0)

    return statvfs


def test_an_enospc_oserror_names_its_file_and_the_free_space(tmp_path):
    exc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "weights" / "step_3"))
    error = as_disk_error(exc, tmp_path)
    assert str(error).startswith(f"no space left on device: cannot write {tmp_path / 'weights' / 'step_3'} (")
    assert "free on /" in str(error) and "--ckpt.resume-step latest" in str(error)


def test_a_library_error_quoting_the_os_error_is_recognised(tmp_path):
    exc = RuntimeError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: ... os error 28")
    assert "no space left on device: cannot write " + str(tmp_path) in str(as_disk_error(exc, tmp_path))


def test_the_cause_chain_is_searched(tmp_path):
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "x"))
        except OSError as inner:
            raise RuntimeError("checkpoint failed") from inner
    except RuntimeError as exc:
        error = as_disk_error(exc, tmp_path)
    assert str(error).startswith(f"read-only file system: cannot write {tmp_path / 'x'} (")
    assert "mounted read-only" in str(error)


def test_an_unexplained_error_is_blamed_on_the_disk_only_when_it_is_full_or_read_only(tmp_path, monkeypatch):
    torch_zip_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    monkeypatch.setattr(disk.os, "statvfs", fake_statvfs(free=10 << 30))
    assert as_disk_error(torch_zip_error, tmp_path) is None
    assert as_disk_error(torch_zip_error, None) is None
    monkeypatch.setattr(disk.os, "statvfs", fake_statvfs(free=4096))
    assert str(as_disk_error(torch_zip_error, tmp_path)).startswith(f"no space left on device: cannot write {tmp_path}")
    assert "4.0 KiB free" in str(as_disk_error(torch_zip_error, tmp_path))
    monkeypatch.setattr(disk.os, "statvfs", fake_statvfs(free=10 << 30, read_only=True))
    assert str(as_disk_error(torch_zip_error, tmp_path)).startswith("read-only file system")


def test_other_errors_are_not_disk_errors(tmp_path):
    assert as_disk_error(OSError(errno.ENOENT, "No such file"), tmp_path) is None
    assert as_disk_error(ValueError("bad value"), tmp_path) is None


def test_a_path_that_does_not_exist_yet_is_measured_on_its_nearest_parent(tmp_path):
    exc = OSError(errno.ENOSPC, "No space left on device")
    assert f"cannot write {tmp_path / 'a' / 'b'}" in str(as_disk_error(exc, tmp_path / "a" / "b"))


@pytest.mark.parametrize(("count", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB")])
def test_human_bytes(count, text):
    assert human_bytes(count) == text


def test_an_entrypoint_turns_a_disk_error_into_one_line_and_exit_code_1(tmp_path, capsys):
    def body(_config):
        raise RuntimeError("write failed") from OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f"))

    with pytest.raises(SystemExit) as exit_info:
        run_main(RunConfig, body, ["--output-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: no space left on device: cannot write {tmp_path / 'f'}")


def test_an_entrypoint_lets_other_errors_through(tmp_path):
    def body(_config):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        run_main(RunConfig, body, ["--output-dir", str(tmp_path)])


def test_a_dcp_checkpoint_exception_is_unwrapped_to_the_rank_failure(tmp_path):
    from torch.distributed.checkpoint.api import CheckpointException

    enospc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "__0_0.distcp"))
    exc = CheckpointException("save failed", {0: (enospc, None)})
    assert not isinstance(exc, Exception)  # why run_main catches BaseException
    assert str(as_disk_error(exc, tmp_path)).startswith(f"no space left on device: cannot write {tmp_path}")


def test_an_entrypoint_reports_a_dcp_exception_on_a_full_disk_in_one_line(tmp_path, capsys):
    from torch.distributed.checkpoint.api import CheckpointException

    def body(_config):
        enospc = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "__0_0.distcp"))
        raise CheckpointException("save failed", {0: (enospc, None)})

    with pytest.raises(SystemExit) as exit_info:
        run_main(RunConfig, body, ["--output-dir", str(tmp_path)])
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.startswith("error: no space left on device: cannot write ")

"""A full or read-only disk, reported as one line whatever library hit it.

Writers fail in many ways when the disk is full: a plain `OSError` (ENOSPC), a
safetensors error quoting "os error 28", torch's zip writer ("unexpected pos 64 vs 0")
or a checkpoint exception that wraps the real one. So an exception is blamed on the disk
when it (or an exception in its cause chain) says so, or when the run directory's file
system is, after the failure, read-only or (nearly) out of space.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from prime_rl.utils.errors import PrimeError

DISK_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
# How the same errors read when a library turned them into text (Rust's io::Error: "os error 28").
DISK_TEXTS = {
    "no space left on device": errno.ENOSPC, "os error 28": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT, "os error 122": errno.EDQUOT,
    "read-only file system": errno.EROFS, "os error 30": errno.EROFS,
}
# Below this many free bytes a write that failed for an unstated reason is blamed on the disk.
LOW_SPACE_BYTES = 1 << 20


class DiskError(PrimeError):
    """The output directory's disk is full or read-only. Fix the disk, then resume."""


def human_bytes(count: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    value, unit = float(count), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{count} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def nearest_existing(path: Path) -> Path:
    """`path` or its nearest existing parent (statvfs needs a path that exists)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    path = nearest_existing(path)
    while not os.path.ismount(path):
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    stats = os.statvfs(nearest_existing(path))
    return stats.f_bavail * stats.f_frsize


def disk_state(path: Path) -> int | None:
    """ENOSPC/EROFS when the file system holding `path` is out of space or read-only now, else None."""
    try:
        stats = os.statvfs(nearest_existing(path))
    except OSError:
        return None
    if stats.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if stats.f_bavail * stats.f_frsize < LOW_SPACE_BYTES:
        return errno.ENOSPC
    return None


def _linked(exc: BaseException) -> list[BaseException]:
    """The exceptions `exc` wraps: its cause and context, and the per-rank failures of a DCP
    `CheckpointException` (`failures`: rank -> exception or (exception, traceback))."""
    linked = [exc.__cause__, exc.__context__]
    for failure in (getattr(exc, "failures", None) or {}).values():
        linked.append(failure[0] if isinstance(failure, tuple) else failure)
    return [e for e in linked if isinstance(e, BaseException)]


def _stated_errno(exc: BaseException) -> tuple[int, str | None] | None:
    """(errno, file name) when `exc` or an exception it wraps says the disk is full or read-only."""
    pending, seen = [exc], set()
    while pending:
        exc = pending.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return exc.errno, exc.filename
        text = str(exc).lower()
        for needle, code in DISK_TEXTS.items():
            if needle in text:
                return code, None
        pending += _linked(exc)
    return None


def describe(code: int, path: Path) -> str:
    """The one line: what is wrong, with which path, how much space is left where, what to do."""
    mount = mount_point(path)
    if code == errno.EROFS:
        return f"{DISK_ERRNOS[code]}: cannot write {path} ({mount} is mounted read-only)"
    try:
        free = human_bytes(free_bytes(path))
    except OSError:
        free = "unknown"
    return (f"{DISK_ERRNOS[code]}: cannot write {path} ({free} free on {mount}); free space, then continue "
            "with --ckpt.resume-step latest")


def as_disk_error(exc: BaseException, output_dir: Path | None) -> DiskError | None:
    """A `DiskError` when `exc` came from a full or read-only disk, else None.

    The path named is the file from the error when it has one, else `output_dir`.
    """
    stated = _stated_errno(exc)
    if stated is not None:
        code, filename = stated
        path = Path(os.fsdecode(filename)) if filename else output_dir
        return DiskError(describe(code, path)) if path is not None else DiskError(DISK_ERRNOS[code])
    if output_dir is None:
        return None
    code = disk_state(output_dir)
    return DiskError(describe(code, Path(output_dir))) if code is not None else None

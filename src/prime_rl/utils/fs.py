"""Atomic file writes and bounded waits: the output directory's two rules.

Every file is written under a temporary name in the same directory and renamed into
place, so a reader never sees half a file. Every wait has a timeout and a clear error.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prime_rl.utils.errors import PrimeError


class WaitTimeout(PrimeError):
    """Something we waited for did not appear in time."""


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary file path beside `path`; on success rename it onto `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `path`; on success rename it onto `path`.

    An existing directory at `path` is replaced. Readers wait for `path` to exist, so
    they see either nothing or the complete directory.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        replace_dir(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _set_aside(path: Path) -> Path | None:
    """Rename the directory `path` to a unique temporary name beside it (`.<name>.<random>.tmp`, which the
    launcher clears before a resume, `run_dir.remove_temporaries`) and return that name; None if `path` is
    gone (another process pruned it first). A rename allocates nothing, so it works on a full disk."""
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def replace_dir(new: Path, path: Path) -> None:
    """Rename the directory `new` onto `path`, replacing what is there: the old one is set aside first and
    deleted after, so `path` is missing only between two renames, never half-deleted (a process killed
    mid-way leaves the old one whole or a temporary)."""
    path = Path(path)
    aside = _set_aside(path) if path.exists() else None
    os.replace(new, path)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def remove_dir(path: Path) -> None:
    """Delete the directory `path` so that nobody, a process killed mid-way included, sees it half-deleted:
    set aside under a temporary name, then removed. Already gone: nothing to do. Where it cannot be renamed (a
    read-only parent, say) it is deleted in place, as much as can be."""
    path = Path(path)
    try:
        aside = _set_aside(path)
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
        return
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def wait_for_path(path: Path, timeout_s: float, what: str, poll_s: float = 0.05, alive=None) -> float:
    """Wait until `path` exists; return the seconds waited.

    `alive`, if given, is called each poll and may raise to abort the wait early (for
    example when the producer process died). Raises `WaitTimeout` naming `what`.
    """
    path = Path(path)
    start = time.monotonic()
    while not path.exists():
        if alive is not None:
            alive()
        waited = time.monotonic() - start
        if waited > timeout_s:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what} ({path})")
        time.sleep(min(poll_s * (1 + waited), 1.0))
    return time.monotonic() - start


_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"step_{step}"


def step_number(name: str) -> int | None:
    """N of a `step_N` name, else None."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def list_steps(directory: Path) -> list[int]:
    """Sorted N of the `step_N` subdirectories of `directory` (temporary names excluded)."""
    if not Path(directory).is_dir():
        return []
    return sorted(n for p in Path(directory).iterdir() if (n := step_number(p.name)) is not None and p.is_dir())


def remove_steps_from(directory: Path, first: int) -> None:
    """Delete the `step_N` subdirectories of `directory` with N >= first."""
    for step in list_steps(directory):
        if step >= first:
            remove_dir(step_path(directory, step))


def prune_steps(directory: Path, keep: int | None) -> None:
    """Delete all but the newest `keep` step_N directories (checkpoints: `run_dir.prune_checkpoints`)."""
    if keep is None:
        return
    for step in list_steps(directory)[:-keep]:
        remove_dir(step_path(directory, step))

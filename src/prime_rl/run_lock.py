"""The lock of a run directory: `<output_dir>/.prime-rl-run.lock` (`run_dir.run_lock_file`), a flock.

- `rl` (and `sft`) hold it **exclusively** while they run there: a second command in that directory,
  `--overwrite` included, is refused in one line naming the running one, before anything is deleted.
- A trainer or an orchestrator started by hand (a deployment that runs the components itself,
  docs/deployment.md) holds it **shared**: the trainer and the orchestrator of one run (and every rank of a
  torchrun trainer) run side by side, while an `rl` or `sft` there, or a hand-started component beside a
  running `rl`, is refused.
- The components `rl` starts do not lock: `rl` holds the lock for them and says so in their environment
  (`HELD_BY_PARENT_ENV`; a trainer node that joins an `rl` run's rendezvous by hand, as the SLURM script's do,
  sets it too). Of a torchrun job only global rank 0 locks: the other ranks are part of its run (an exclusive
  `sft` on K ranks would otherwise refuse its own ranks 1..K-1).

The kernel drops a flock when its process ends, however it ends, so the lock file of a dead run never blocks;
the file itself is never deleted. The file holds the name and pid of the process that last took the lock, for
the message.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

from prime_rl.run_dir import run_lock_file
from prime_rl.utils.errors import ConfigError

HELD_BY_PARENT_ENV = "PRIMERL_RUN_LOCK_HELD"  # set by rl for the components it starts (the value names rl)


class RunLock:
    """A held run lock, until `release` or the end of the process."""

    def __init__(self, fd: int):
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the only descriptor of the open file drops the flock
            self._fd = -1


def take(out: Path, command: str, shared: bool = False) -> RunLock:
    """Take `out`'s run lock (`out` exists), shared or exclusive; a one-line ConfigError naming the process that
    holds it otherwise. The descriptor is not inherited by child processes (Python's default)."""
    fd = os.open(run_lock_file(out), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "prime-rl process"
        os.close(fd)
        raise ConfigError(f"output dir {out} is in use by a running {holder}: let it finish or stop it first "
                          "(then continue it with --ckpt.resume-step latest)") from None
    except OSError as exc:  # a filesystem without flock (some NFS mounts): run, unlocked, and say so
        os.close(fd)
        print(f"warning: cannot lock {out} ({exc.strerror}): a second run there would not be refused",
              file=sys.stderr)
        return RunLock(-1)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{command} (pid {os.getpid()})\n".encode(), 0)
    return RunLock(fd)


def take_for_component(out: Path | None, command: str, shared: bool) -> RunLock | None:
    """The lock a component takes when it starts (module docstring): none when `rl` holds it for this process,
    in a torchrun rank other than 0 (`RANK`), or when there is no directory to lock yet and it cannot be made (the
    component's own first write then reports the disk's problem)."""
    if out is None or os.environ.get(HELD_BY_PARENT_ENV) or os.environ.get("RANK", "0") != "0":
        return None
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return take(Path(out), command, shared)

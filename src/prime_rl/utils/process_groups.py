"""Child processes that never outlive their owner: each runs in its own process group, which its owner signals as
a whole (so the child's own children stop with it), and, on Linux, the kernel signals the child when its parent
dies, even by SIGKILL (`PR_SET_PDEATHSIG`). Used by `rl` for its components and by agent commands
(`envs/agent.py`)."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _signal_on_parent_death(sig: int) -> None:  # pragma: no cover - runs in the child
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except OSError:
        pass


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that asks Linux to send the child `sig` when its parent dies (None elsewhere)."""
    return functools.partial(_signal_on_parent_death, sig) if sys.platform.startswith("linux") else None


def signal_group(pid: int, sig: int) -> None:
    """Send `sig` to the process group led by `pid` (started with `start_new_session`); nothing if it is gone."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

"""A child that starts before what it needs is ready waits at a gate its parent opens.

`rl` starts the orchestrator together with the inference server and the trainer, so that its imports (seconds of
CPU) overlap the server's start instead of following it, and opens the gate once the servers answer their health
checks: the orchestrator connects only then, as if it had been started at that moment. The gate is the child's
stdin: the parent writes one line and closes it (`launch.processes.Child.open_gate`).
"""

from __future__ import annotations

import os
import sys

START_GATE_ENV = "PRIME_START_GATE"
"""Set (to "stdin") by the parent for a child it starts gated."""


def wait_at_start_gate() -> None:
    """Block until the parent opens the gate, when this process was started gated (else return at once). End of
    input before a line (the parent stopped the run before opening it): exit quietly."""
    if os.environ.get(START_GATE_ENV) != "stdin":
        return
    if not sys.stdin.readline():
        raise SystemExit(0)

"""Child processes of `rl`: start, watch, and stop them without leaving orphans.

Each child runs in its own process group (so torchrun's workers and vLLM's engine stop
with it) and, on Linux, is told by the kernel to stop if the launcher itself dies.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from prime_rl.utils.process_groups import die_with_parent, signal_group
from prime_rl.utils.start_gate import START_GATE_ENV


@dataclass
class Child:
    name: str
    command: list[str]
    log_path: Path
    env: dict[str, str] = field(repr=False)  # holds the run's inference API key
    gated: bool = False  # its stdin is a pipe it waits on until `open_gate` (utils.start_gate)
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if self.gated else subprocess.DEVNULL,
                env={**self.env, START_GATE_ENV: "stdin"} if self.gated else self.env,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )

    def open_gate(self) -> None:
        """Let a gated child go on: one line on its stdin, then end of input. Nothing for a child that is not gated,
        not started, already let go, or already exited."""
        pipe = None if self.process is None else self.process.stdin
        if pipe is None or pipe.closed:
            return
        try:
            pipe.write(b"go\n")
            pipe.close()
        except OSError:  # it exited meanwhile (a broken pipe): supervision reports why
            pass

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.process is not None:
            signal_group(self.process.pid, sig)

    def last_lines(self, count: int = 20) -> list[str]:
        try:
            with open(self.log_path, errors="replace") as log:
                return [line.rstrip("\n") for line in deque(log, maxlen=count)]
        except FileNotFoundError:
            return []


def stop_all(children: list[Child], grace_s: float = 10.0) -> None:
    """SIGTERM every child's process group, wait up to `grace_s`, then SIGKILL what is left.

    The groups are killed even after the group leader exited, so grandchildren
    (torchrun workers, engine processes) never outlive the run.
    """
    for child in children:
        child.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for child in children:
        child.signal_group(signal.SIGKILL)
        if child.process is not None:
            try:
                child.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

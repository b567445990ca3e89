"""One logger setup for every process: stderr plus a log file (a run's `logs/<name>.log`, `run_dir.log_file`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"
# Set by `rl` for its children: it already sends their stderr to logs/<name>.log.
LOG_FILE_BY_PARENT_ENV = "PRIMERL_LOG_FILE_BY_PARENT"


def setup_logging(name: str, log_file: Path | None = None, level: str = "INFO") -> logging.Logger:
    """Configure the `prime_rl` logger once per process and return the logger `name`.

    With `log_file`, lines also go there (appended, so a resumed run keeps its history), unless `rl` started
    this process and already sends its stderr there.
    """
    root = logging.getLogger("prime_rl")
    root.setLevel(level)
    root.propagate = False
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(FORMAT, datefmt="%H:%M:%S")
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(formatter)
    root.addHandler(stream)
    if log_file is not None and not os.environ.get(LOG_FILE_BY_PARENT_ENV):
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(formatter)
        root.addHandler(file_handler)
    return get_logger(name)


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"prime_rl.{name}")


def ensure_logging(name: str) -> logging.Logger:
    """The logger `name`, setting up the `prime_rl` logger (to stderr) first unless this process already did: for
    code that runs in processes prime-rl does not start itself (vLLM's API server and workers)."""
    if not logging.getLogger("prime_rl").handlers:
        return setup_logging(name)
    return get_logger(name)

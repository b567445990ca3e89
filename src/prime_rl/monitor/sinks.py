"""Metric sinks: JSONL (always), console, and W&B (never allowed to stop training)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prime_rl.configs.shared import WandbConfig
from prime_rl.utils.fs import atomic_write_text
from prime_rl.utils.logging import get_logger

logger = get_logger("monitor")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `<path>.lock` shared by every process of the run: appends and the
    resume rewrite take it, so no line is appended to a file that is being replaced."""
    fd = os.open(path.with_name(path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete, parseable lines of a metrics file (a torn last line is skipped)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def drop_steps_from(path: Path, step: int, sources: tuple[str, ...]) -> int:
    """Remove the lines of `sources` with a step >= `step` (a resumed run re-logs them); returns how many.

    The file is rewritten atomically, and only when something is dropped.
    """
    path = Path(path)
    if not path.exists():
        return 0
    with _locked(path):
        lines = path.read_text().splitlines(keepends=True)
        kept = []
        for line in lines:
            try:
                row = json.loads(line)
                stale = row.get("source") in sources and int(row.get("step", -1)) >= step
            except (json.JSONDecodeError, TypeError, ValueError):
                stale = not line.endswith("\n")  # a line torn by a killed writer goes too
            if not stale:
                kept.append(line if line.endswith("\n") else line + "\n")
        dropped = len(lines) - len(kept)
        if dropped:
            atomic_write_text(path, "".join(kept))
    return dropped


class JsonlSink:
    """Appends `{"step", "source", "time", **metrics}` lines to `metrics.jsonl`.

    Each line is one `write` on a file opened for appending, under the file's lock, so the
    lines of several processes logging to the same file do not interleave or get lost.
    """

    def __init__(self, path: Path, source: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.source = source

    def log(self, metrics: dict[str, float], step: int) -> None:
        line = json.dumps({"step": step, "source": self.source, "time": time.time(), **metrics}) + "\n"
        with _locked(self.path):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def close(self) -> None:
        pass


class ConsoleSink:
    """One compact line per step through the logger (rich-formatted numbers)."""

    def __init__(self, source: str, keys: tuple[str, ...] | None = None):
        self.source = source
        self.keys = keys

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = {k: v for k, v in metrics.items() if self.keys is None or k in self.keys}
        text = "  ".join(f"{k}={v:.4g}" for k, v in shown.items())
        logger.info("step %d  %s", step, text)

    def close(self) -> None:
        pass


def resolve_wandb_mode(config: WandbConfig) -> str:
    """online/offline/disabled; unset means online with WANDB_API_KEY, else offline."""
    if config.mode is not None:
        return config.mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbSink:
    """Logs to a W&B run; any W&B failure is reported once and turns this sink off.

    A resumed component (`resume_step` = N) starts a new W&B run `<name>-<source>-resumed-N`
    and first replays `history` (this source's metrics.jsonl rows of steps < N), so the newest
    W&B run of a source holds every step exactly once. W&B cannot truncate a run's history
    (its "rewind" is a private preview), so the interrupted run keeps its lines for the steps
    that were re-run: look at the newest run of the group.
    """

    def __init__(self, config: WandbConfig, output_dir: Path, source: str, run_config: dict[str, Any] | None,
                 resume_step: int | None = None, history: list[dict[str, Any]] = ()):
        self.run = None
        self.mode = resolve_wandb_mode(config)
        if self.mode == "disabled":
            return
        name = config.name or Path(output_dir).resolve().name
        suffix = f"-resumed-{resume_step}" if resume_step is not None else ""
        try:
            import wandb

            self.run = wandb.init(
                project=config.project,
                name=f"{name}-{source}{suffix}",
                group=name,
                job_type=source,
                mode=self.mode,
                dir=str(output_dir),
                config=run_config or {},
                reinit="create_new",
            )
        except Exception as exc:  # W&B must never take training down
            self._disable(f"could not start ({exc})")
            return
        for row in history:
            metrics = {k: v for k, v in row.items() if k not in ("step", "source", "time")}
            self.log(metrics, int(row["step"]))

    def _disable(self, why: str) -> None:
        logger.warning("W&B %s; continuing without it (metrics.jsonl still has everything)", why)
        self.run = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log(metrics, step=step)
        except Exception as exc:
            self._disable(f"logging failed ({exc})")

    def table(self, name: str, columns: tuple[str, ...], rows: list[list], step: int) -> None:
        """`rows` as a `wandb.Table` named `name` at `step` (cells that are not numbers or text as JSON text)."""
        if self.run is None:
            return
        try:
            import wandb

            cells = [[c if c is None or isinstance(c, int | float | str) else json.dumps(c) for c in row]
                     for row in rows]
            self.run.log({name: wandb.Table(columns=list(columns), data=cells)}, step=step)
        except Exception as exc:
            self._disable(f"logging a table failed ({exc})")

    @property
    def run_dir(self) -> Path | None:
        return Path(self.run.dir).parent if self.run is not None else None

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as exc:
            self._disable(f"finish failed ({exc})")

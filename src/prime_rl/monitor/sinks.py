"""Metric sinks: JSONL (always), console, and W&B (never allowed to stop training)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from prime_rl.configs.shared import WandbConfig
from prime_rl.utils.logging import get_logger

logger = get_logger("monitor")


class JsonlSink:
    """Appends `{"step", "source", "time", **metrics}` lines to `metrics.jsonl`.

    Each line is one `write` on a file opened for appending, so the lines of several
    processes logging to the same file do not interleave.
    """

    def __init__(self, path: Path, source: str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.source = source

    def log(self, metrics: dict[str, float], step: int) -> None:
        line = json.dumps({"step": step, "source": self.source, "time": time.time(), **metrics}) + "\n"
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
    """Logs to a W&B run; any W&B failure is reported once and turns this sink off."""

    def __init__(self, config: WandbConfig, output_dir: Path, source: str, run_config: dict[str, Any] | None):
        self.run = None
        self.mode = resolve_wandb_mode(config)
        if self.mode == "disabled":
            return
        name = config.name or Path(output_dir).resolve().name
        try:
            import wandb

            self.run = wandb.init(
                project=config.project,
                name=f"{name}-{source}",
                group=name,
                job_type=source,
                mode=self.mode,
                dir=str(output_dir),
                config=run_config or {},
                reinit="create_new",
            )
        except Exception as exc:  # W&B must never take training down
            self._disable(f"could not start ({exc})")

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

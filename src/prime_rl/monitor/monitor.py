"""`Monitor`: the single entry point components use to log metrics."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prime_rl.configs.shared import WandbConfig
from prime_rl.configs.toml_io import write_toml
from prime_rl.monitor.sinks import ConsoleSink, JsonlSink, WandbSink, drop_steps_from, read_jsonl
from prime_rl.run_dir import config_file, metrics_file


def to_float(value: Any) -> float:
    """A metric as a float: a tensor's mean, anything else `float(value)`. torch is not imported for the check (the
    launcher imports this package): a value can only be a tensor where torch was imported already."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return float(value.detach().float().mean())
    return float(value)


class Monitor:
    """Fans `log(metrics, step)` out to `<output_dir>/metrics.jsonl`, the console and W&B.

    The run config is written to `<output_dir>/configs/<source>.toml` and recorded in W&B.
    Non-finite values are logged as they are (the JSONL line holds NaN) so they stay visible.
    A component resumed at step N passes `resume_step=N`: its lines of steps >= N are dropped
    from metrics.jsonl (they are logged again) and W&B gets a run holding every step once.
    """

    def __init__(
        self,
        output_dir: Path,
        source: str,
        wandb: WandbConfig | None = None,
        run_config: dict[str, Any] | None = None,
        console: bool = True,
        console_keys: tuple[str, ...] | None = None,
        resume_step: int | None = None,
    ):
        self.output_dir = Path(output_dir)
        self.source = source
        if run_config is not None:
            write_toml(config_file(self.output_dir, source), run_config)
        path = metrics_file(self.output_dir)
        history: list[dict[str, Any]] = []
        if resume_step is not None:
            # Steps >= resume_step are re-run: their old lines go, so every step appears once.
            drop_steps_from(path, resume_step, (source,))
            history = [row for row in read_jsonl(path) if row.get("source") == source]
        self.jsonl = JsonlSink(path, source)
        self.sinks: list[Any] = [self.jsonl]
        if console:
            self.sinks.append(ConsoleSink(source, console_keys))
        self.wandb = WandbSink(wandb or WandbConfig(), self.output_dir, source, run_config, resume_step, history)
        self.sinks.append(self.wandb)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = {key: to_float(value) for key, value in metrics.items()}
        for sink in self.sinks:
            sink.log(values, step)

    def table(self, name: str, columns: tuple[str, ...], rows: list[list], step: int) -> None:
        """A table at `step` (W&B only: metrics.jsonl and the console hold numbers)."""
        self.wandb.table(name, columns, rows, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


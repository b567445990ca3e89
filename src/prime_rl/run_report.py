"""Read the run's metrics.jsonl: live progress for `rl` (`ProgressView`: a bar on a terminal, a line per step
elsewhere), its summary, and metrics.png."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prime_rl.samples_summary import COLUMNS, step_rows
from prime_rl.utils.fs import atomic_path

PLOTTED = (  # (key, source, title); a panel whose series is absent (a loss without a soft gate) says n/a
    ("reward/mean", "orchestrator", "reward"),
    ("loss/total", "trainer", "loss"),
    ("loss/entropy", "trainer", "entropy"),
    ("optim/grad_norm", "trainer", "grad norm"),
    ("loss/mismatch_kl", "trainer", "mismatch KL"),
    ("loss/importance_ratio", "trainer", "importance ratio"),
    ("loss/soft_gate_weight", "trainer", "soft gate weight"),
    ("seq_len/completion_mean", "orchestrator", "completion tokens"),
    ("async/policy_lag_mean", "orchestrator", "policy lag (steps)"),
)
SFT_PLOTTED = (
    ("loss/sft", "sft", "loss"),
    ("eval/reward", "sft", "eval reward"),
    ("optim/grad_norm", "sft", "grad norm"),
    ("optim/lr", "sft", "learning rate"),
)
MULTI_TURN_PLOTTED = (  # added when any step had more than one turn per rollout
    ("rollout/turns_mean", "orchestrator", "turns per rollout"),
    ("rollout/tool_calls_mean", "orchestrator", "tool calls per rollout"),
)


@dataclass
class MetricsTail:
    """Follows metrics.jsonl as it grows; keeps every (source, key) series by step."""

    path: Path
    offset: int = 0
    series: dict[tuple[str, str], dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    since: float = 0.0  # ignore records written before this time (a split run's server node: not an old run's)
    inode: int | None = None  # of the file read so far

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                stat = os.fstat(f.fileno())
                if stat.st_ino != self.inode or stat.st_size < self.offset:  # new, or replaced (--overwrite elsewhere)
                    self.inode, self.offset = stat.st_ino, 0
                    self.series.clear()
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
        self.offset += len(complete)
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                continue
            source, step = record.pop("source", "?"), record.pop("step", None)
            written = record.pop("time", None)
            if step is None or (isinstance(written, int | float) and written < self.since):
                continue
            for key, value in record.items():
                if isinstance(value, int | float):
                    self.series[(source, key)][int(step)] = float(value)

    def get(self, source: str, key: str) -> dict[int, float]:
        return self.series.get((source, key), {})

    def last(self, source: str, key: str) -> tuple[int, float] | None:
        values = self.get(source, key)
        if not values:
            return None
        step = max(values)
        return step, values[step]


ENV_FAILURE_WARN_FRAC = 0.5
"""A step whose environment failed more than this share of its rollouts is a console warning."""


def step_warning(tail: MetricsTail, step: int) -> str | None:
    """Why the batch of `step` (0-based) trains nothing the run is for, in words for the console, else None: most
    of its rollouts failed in the environment (left out of training, or scored 0), every group's rewards were equal
    (every advantage is 0), or every group was filtered or left unusable by failures (an empty batch)."""
    failed = tail.get("orchestrator", "rollout/env_error_frac").get(step)
    if failed is not None and failed > ENV_FAILURE_WARN_FRAC:
        return (f"{failed:.0%} of the rollouts failed in the environment (see logs/orchestrator.log; they train "
                "nothing, or as 0 with on_error = \"zero\"; on_error = \"fail\" in [[orchestrator.env]] stops the run "
                "instead)")
    if tail.get("orchestrator", "advantage/no_signal").get(step) == 1.0:
        return ("no learning signal: every group's rewards were equal, so every advantage and the policy loss are 0 "
                "(orchestrator.dynamic_sampling draws new prompts in place of such groups)")
    if tail.get("orchestrator", "rollout/num_samples").get(step) == 0:
        filtered = tail.get("orchestrator", "rollout/filtered_frac").get(step, 1.0)
        return (f"trained on an empty batch: every group was filtered (rollout/filtered_frac {filtered:.2f}: "
                "equal rewards, or too few rollouts left after failures; see logs/orchestrator.log)")
    return None


def summary_lines(tail: MetricsTail, wall_s: float, output_dir: Path) -> list[str]:
    rewards = tail.get("orchestrator", "reward/mean")
    trained = tail.get("trainer", "loss/importance_ratio") or tail.get("trainer", "optim/lr")
    lines = [f"steps trained: {len(trained)}"]
    warned = [step for step in sorted(trained) if step_warning(tail, step) is not None]
    if warned:
        lines.append(f"warning: {len(warned)} of them trained on an empty, mostly failed or signal-less batch (steps "
                     f"{', '.join(str(step + 1) for step in warned[:10])}{' ...' if len(warned) > 10 else ''})")
    if rewards:
        steps = sorted(rewards)
        last5 = [rewards[s] for s in steps[-5:]]
        lines.append(
            f"reward: {rewards[steps[0]]:.3f} (step {steps[0] + 1}) -> "
            f"{rewards[steps[-1]]:.3f} (step {steps[-1] + 1}); "
            f"mean of last {len(last5)}: {sum(last5) / len(last5):.3f}"
        )
    lines.append(f"wall time: {wall_s:.0f}s")
    lines.append(f"outputs: {output_dir} (metrics.jsonl, metrics.png, rollouts/step_N/samples.jsonl, weights/, "
                 "checkpoints/, logs/)")
    lines.append(f"read the rollouts: uv run prime-rl view {output_dir}")
    return lines


def sft_summary_lines(tail: MetricsTail, wall_s: float, output_dir: Path) -> list[str]:
    """What `sft` prints at the end, in `summary_lines`' style: steps, loss and eval reward first -> last."""
    losses = tail.get("sft", "loss/sft")
    lines = [f"steps trained: {len(losses)}"]
    for label, key in (("loss", "loss/sft"), ("eval reward", "eval/reward")):
        values = tail.get("sft", key)
        if values:
            first, last = min(values), max(values)
            lines.append(f"{label}: {values[first]:.3f} (step {first + 1}) -> {values[last]:.3f} (step {last + 1})")
    lines.append(f"wall time: {wall_s:.0f}s")
    lines.append(f"outputs: {output_dir} (metrics.jsonl, metrics.png, weights/, checkpoints/)")
    return lines


def write_plot(tail: MetricsTail, path: Path, plotted: tuple[tuple[str, str, str], ...] = PLOTTED) -> Path | None:
    """Plot `plotted` (rl: `PLOTTED`, and `MULTI_TURN_PLOTTED` for multi-turn runs; sft: `SFT_PLOTTED`) over
    1-based steps, in two columns; a metric the run does not log is an empty panel marked n/a. None when nothing
    was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    if plotted is PLOTTED and any(turns > 1 for turns in tail.get("orchestrator", "rollout/turns_mean").values()):
        plotted += MULTI_TURN_PLOTTED
    panels = [(title, tail.get(source, key)) for key, source, title in plotted]
    if not any(values for _, values in panels):
        return None
    rows = -(-len(panels) // 2)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 2.1 * rows), sharex=True, squeeze=False)
    for ax, (title, values) in zip(axes.flat, panels, strict=False):
        steps = sorted(values)
        ax.plot([s + 1 for s in steps], [values[s] for s in steps], marker=".")
        if not values:
            ax.text(0.5, 0.5, "n/a", transform=ax.transAxes, ha="center", va="center", color="gray")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path


class ProgressView:
    """A live bar on a terminal; one line per trained step otherwise (logs, CI)."""

    def __init__(self, console: Console, total: int, start: int = 0, samples_from: Path | None = None,
                 sample_rows: int = 0):
        self.console = console
        self.samples_from, self.sample_rows = samples_from, sample_rows
        """The run directory whose written rollouts to show, and how many of each step (`samples.console_rows`)."""
        self.total = total
        self.start = start
        self.started = time.monotonic()
        self.shown_step = start  # a resumed run starts at its checkpoint step
        self.bar = None
        if console.is_terminal:
            self.bar = Progress(
                TextColumn("[bold]rl"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(), console=console,
            )
            self.task = self.bar.add_task("steps", total=total, completed=start, info="starting")
            self.bar.start()

    def update(self, tail: MetricsTail) -> None:
        trained = tail.last("trainer", "perf/step_time_s")
        if trained is None or trained[0] + 1 <= self.shown_step:
            return
        step, step_time = trained
        for new in range(self.shown_step, step + 1):  # every step trained since the last update (0-based)
            warning = step_warning(tail, new)
            if warning is not None:
                self.console.print(f"step {new + 1}/{self.total}: warning: {warning}")
            if self.sample_rows and self.samples_from is not None:
                self.print_samples(new)
        self.shown_step = step + 1
        info = progress_info(tail, step, step_time)
        if self.bar is None:  # a log file or pipe: elapsed time and ETA in the line (a terminal's bar shows elapsed)
            done = self.shown_step - self.start
            elapsed = time.monotonic() - self.started
            info += f"  elapsed {clock(elapsed)}  eta {clock(elapsed / max(done, 1) * (self.total - self.shown_step))}"
        if self.bar is not None:
            self.bar.update(self.task, completed=self.shown_step, info=info)
        else:
            self.console.print(f"step {self.shown_step}/{self.total}  {info}")

    def print_samples(self, step: int) -> None:
        """The first `sample_rows` rollouts step `step` (0-based) wrote, one line each, cut to the console's width."""
        rows = step_rows(self.samples_from, step, self.sample_rows)
        if not rows:
            return
        table = Table(title=f"step {step + 1}: {len(rows)} rollout(s) of rollouts/step_{step}/samples.jsonl",
                      title_justify="left", expand=True)
        for name, ratio in (("prompt", 2), ("completion", 3), ("reward", 0), ("advantage", 0)):
            table.add_column(name, ratio=ratio or None, no_wrap=True, overflow="ellipsis",
                             justify="right" if not ratio else "left")
        for row in rows:
            values = dict(zip(COLUMNS, row, strict=True))
            advantage = values["advantage"]
            table.add_row(one_line(values["prompt"]), one_line(values["completion"]), f"{values['reward']:.3f}",
                          "dropped" if advantage is None else f"{advantage:+.3f}")
        self.console.print(table)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def one_line(text: str) -> str:
    """Text for one table cell: newlines shown as ⏎, markup characters shown as themselves."""
    return escape(str(text).replace("\r", "").replace("\n", " ⏎ "))


def progress_info(tail: MetricsTail, step: int, trainer_s: float) -> str:
    """What a progress line says of 0-based `step`: reward (of the batch trained on), loss, mismatch KL, and the
    trainer's and the orchestrator's own step times (the slower one sets the pace)."""
    parts = []
    for label, source, key, form in (("reward", "orchestrator", "reward/mean", "{:.3f}"),
                                     ("loss", "trainer", "loss/total", "{:.4g}"),
                                     ("kl", "trainer", "loss/mismatch_kl", "{:.2g}")):
        value = tail.get(source, key).get(step)
        if value is not None:
            parts.append(f"{label} {form.format(value)}")
    parts.append(f"trainer {trainer_s:.1f}s")
    rollouts_s = tail.get("orchestrator", "perf/step_time_s").get(step)
    if rollouts_s is not None:
        parts.append(f"rollouts {rollouts_s:.1f}s")
    return "  ".join(parts)


def clock(seconds: float) -> str:
    """h:mm:ss (or m:ss under an hour)."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

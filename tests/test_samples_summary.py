"""What a step's rollouts look like at a glance: the rows made from samples.jsonl, the table `rl` prints (cut to
the terminal, markup shown as text), the W&B samples table (read back from an offline run), and the console's
word for a step whose groups carry no learning signal."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from prime_rl.configs.shared import WandbConfig
from prime_rl.monitor.sinks import WandbSink
from prime_rl.monitor.wandb_offline import run_files, tables, wait_complete
from prime_rl.run_dir import rollout_dir, samples_file
from prime_rl.run_report import ProgressView, step_warning
from prime_rl.samples_summary import COLUMNS, step_rows, summary_rows


def record(rollout: int, completion: str, advantage: float | None) -> dict:
    return {"step": 3, "env": "code", "group": 0, "rollout": rollout, "kept": advantage is not None,
            "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "Print input()\nreversed"}],
            "completion": completion, "reward": 0.5, "advantage": advantage, "finish_reason": "stop", "error": None}


def write_step(output_dir, step, records):
    directory = rollout_dir(output_dir, step)
    directory.mkdir(parents=True)
    lines = [json.dumps(r) for r in records] + [json.dumps({"step": step, "left_out": 2})]
    samples_file(directory).write_text("\n".join(lines) + "\n")


def test_rows_hold_the_last_user_message_and_skip_the_left_out_line(tmp_path):
    write_step(tmp_path, 3, [record(0, "print(1)", 0.25), record(1, "x", None)])
    rows = step_rows(tmp_path, 3, 10)
    assert [dict(zip(COLUMNS, r, strict=True))["prompt"] for r in rows] == ["Print input()\nreversed"] * 2
    assert rows[1][COLUMNS.index("advantage")] is None and step_rows(tmp_path, 3, 1) == rows[:1]
    assert step_rows(tmp_path, 4, 10) == []  # a step that wrote no samples


class Tail:
    """The metrics `rl` reads, as MetricsTail answers them."""

    def __init__(self, rows: dict):
        self.rows = rows

    def get(self, source, key):
        return {step: row[key] for step, row in self.rows.items() if key in row}

    def last(self, source, key):
        values = self.get(source, key)
        return (max(values), values[max(values)]) if values else None


def test_the_console_table_is_cut_to_the_width_and_shows_markup_as_text(tmp_path):
    hostile = "[bold red]</script>" + "x" * 500 + "\nline two \u202e"
    write_step(tmp_path, 0, [record(0, hostile, 1.5), record(1, "ok", None)])
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False)
    view = ProgressView(console, total=3, samples_from=tmp_path, sample_rows=2)
    view.update(Tail({0: {"perf/step_time_s": 1.0, "reward/mean": 0.5}}))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "[bold red]</script>" in text and "+1.500" in text and "dropped" in text
    assert "rollouts/step_0/samples.jsonl" in text


def test_a_step_without_learning_signal_says_so():
    why = step_warning(Tail({0: {"advantage/no_signal": 1.0, "rollout/num_samples": 16}}), 0)
    assert why.startswith("no learning signal: every group's rewards were equal")
    assert step_warning(Tail({0: {"advantage/no_signal": 0.0, "rollout/num_samples": 16}}), 0) is None


@pytest.mark.slow
def test_the_samples_table_reaches_wandb_and_reads_back_offline(tmp_path):
    sink = WandbSink(WandbConfig(mode="offline", project="t"), tmp_path, "orchestrator", {})
    rows = summary_rows([json.dumps(record(0, "</script><b>", 0.5)), json.dumps(record(1, "b", None))])
    sink.log({"reward/mean": 0.5}, 0)
    sink.table("samples", COLUMNS, rows, 0)
    sink.close()
    (file,) = run_files(tmp_path)
    assert wait_complete(file)
    (table,) = tables(file, "samples")
    assert table["step"] == 0 and table["columns"] == list(COLUMNS)
    assert [row[COLUMNS.index("completion")] for row in table["data"]] == ["</script><b>", "b"]

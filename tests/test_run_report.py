"""The end of an `sft` run: the same summary style and a metrics.png as `rl` (`run_report.py`)."""

from __future__ import annotations

import json

from prime_rl.run_report import MetricsTail, sft_summary_lines, summary_lines
from prime_rl.trainer.sft.train import report


def write_sft_metrics(path, steps=4, eval_at=(1, 3)):
    with open(path, "w") as f:
        for step in range(steps):
            row = {"step": step, "source": "sft", "loss/sft": 2.0 - 0.5 * step, "optim/lr": 1e-3,
                   "optim/grad_norm": 1.0}
            if step in eval_at:
                row["eval/reward"] = 0.2 * step
            f.write(json.dumps(row) + "\n")


def test_the_sft_summary_counts_steps_from_1_with_loss_and_eval_reward(tmp_path):
    write_sft_metrics(tmp_path / "metrics.jsonl")
    tail = MetricsTail(tmp_path / "metrics.jsonl")
    tail.poll()
    lines = sft_summary_lines(tail, 12.0, tmp_path)
    assert lines[:3] == ["steps trained: 4", "loss: 2.000 (step 1) -> 0.500 (step 4)",
                         "eval reward: 0.200 (step 2) -> 0.600 (step 4)"]


def test_a_finished_sft_run_prints_its_summary_and_writes_metrics_png(tmp_path, capsys):
    write_sft_metrics(tmp_path / "metrics.jsonl", eval_at=())
    report(tmp_path, 3.0)
    out = capsys.readouterr().out
    assert "steps trained: 4" in out and "eval reward" not in out and f"plot: {tmp_path / 'metrics.png'}" in out
    assert (tmp_path / "metrics.png").read_bytes()[:4] == b"\x89PNG"


def test_progress_of_a_resumed_run_starts_at_the_resume_step(tmp_path):
    """Regression: the bar counted from the last line it found, the interrupted run's."""
    from io import StringIO

    from rich.console import Console

    from prime_rl.run_report import ProgressView

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "source": "trainer", "perf/step_time_s": 1.0}) + "\n"
                            for s in range(3)))
    out = StringIO()
    view = ProgressView(Console(file=out, force_terminal=False), total=6, start=3)
    tail = MetricsTail(path)
    tail.poll()
    view.update(tail)
    assert out.getvalue() == ""  # nothing new trained yet: no line from the old run's steps
    with open(path, "a") as f:
        f.write(json.dumps({"step": 3, "source": "trainer", "perf/step_time_s": 2.0}) + "\n")
    tail.poll()
    view.update(tail)
    assert out.getvalue().startswith("step 4/6")


def test_the_console_warns_on_every_step_whose_batch_was_empty_or_mostly_failed(tmp_path):
    """Regression: a run whose every group was filtered, or whose environment failed every rollout, showed
    ordinary progress lines and a normal summary; the reason was only in logs/orchestrator.log. Each such step
    gets a warning line with the reason (also steps trained between two polls), and the summary counts them."""
    from io import StringIO

    from rich.console import Console

    from prime_rl.run_report import ProgressView

    path = tmp_path / "metrics.jsonl"
    rollouts = {0: {"rollout/num_samples": 16, "rollout/env_error_frac": 0.25},  # fine: a few failures
                1: {"rollout/num_samples": 0, "rollout/env_error_frac": 0.0, "rollout/filtered_frac": 1.0},
                2: {"rollout/num_samples": 16, "rollout/env_error_frac": 0.75},
                3: {"rollout/num_samples": 16, "rollout/env_error_frac": 0.5}}  # at the bound: no warning

    def write(steps):
        with open(path, "a") as f:
            for step in steps:
                f.write(json.dumps({"step": step, "source": "orchestrator", "reward/mean": 0.5,
                                    **rollouts[step]}) + "\n")
                f.write(json.dumps({"step": step, "source": "trainer", "perf/step_time_s": 1.0,
                                    "loss/importance_ratio": 1.0}) + "\n")

    out = StringIO()
    view = ProgressView(Console(file=out, force_terminal=False, width=400), total=4)
    tail = MetricsTail(path)
    write([0])
    tail.poll()
    view.update(tail)
    write([1, 2, 3])  # three steps between two polls
    tail.poll()
    view.update(tail)
    lines = out.getvalue().splitlines()
    warnings = [line for line in lines if "warning" in line]
    assert len(warnings) == 2, lines
    assert warnings[0].startswith("step 2/4: warning: trained on an empty batch: every group was filtered")
    assert warnings[1].startswith("step 3/4: warning: 75% of the rollouts failed in the environment (see logs")
    assert "logs/orchestrator.log" in warnings[0] and 'on_error = "fail"' in warnings[1]
    summary = summary_lines(tail, 1.0, tmp_path)
    assert summary[:2] == ["steps trained: 4", "warning: 2 of them trained on an empty, mostly failed or signal-less "
                                               "batch (steps 2, 3)"]


def test_the_progress_line_shows_loss_kl_both_step_times_elapsed_and_eta_with_1_based_steps(tmp_path):
    """A run whose orchestrator is the slow side (23.7 s of rollouts, 0.1 s of training) says so on the console,
    and steps count from 1 in the progress lines and the summary alike."""
    from io import StringIO

    from rich.console import Console

    from prime_rl.run_report import ProgressView

    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "source": "orchestrator", "reward/mean": 0.25, "perf/step_time_s": 23.7})
                    + "\n" + json.dumps({"step": 0, "source": "trainer", "perf/step_time_s": 0.1, "loss/total": 0.0123,
                                         "loss/mismatch_kl": 1.5e-7, "loss/importance_ratio": 1.0}) + "\n")
    out = StringIO()
    view = ProgressView(Console(file=out, force_terminal=False, width=400), total=3)
    tail = MetricsTail(path)
    tail.poll()
    view.update(tail)
    line = out.getvalue().strip()
    assert line.startswith("step 1/3  reward 0.250  loss 0.0123  kl 1.5e-07  trainer 0.1s  rollouts 23.7s  elapsed 0:")
    assert "eta 0:" in line
    assert "(step 1)" in "\n".join(summary_lines(tail, 1.0, tmp_path))

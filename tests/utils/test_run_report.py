"""The end of an `sft` run: the same summary style and a metrics.png as `rl` (`utils/run_report.py`)."""

from __future__ import annotations

import json

from prime_rl.trainer.sft.train import report
from prime_rl.utils.run_report import MetricsTail, sft_summary_lines


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

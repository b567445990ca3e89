"""Monitor: JSONL always, W&B offline files with the logged keys, W&B failure tolerated."""

from __future__ import annotations

import json

import pytest
import torch

from prime_rl.configs.shared import WandbConfig
from prime_rl.monitor import Monitor
from prime_rl.monitor.sinks import resolve_wandb_mode
from prime_rl.monitor.wandb_offline import history, read_run, wait_complete


def test_jsonl_lines_and_run_config(tmp_path):
    monitor = Monitor(tmp_path, "trainer", WandbConfig(mode="disabled"), run_config={"max_steps": 2})
    monitor.log({"loss/importance_ratio": torch.tensor(1.5), "optim/lr": 1e-3}, step=1)
    monitor.log({"loss/importance_ratio": 0.5, "optim/lr": 2e-3}, step=2)
    monitor.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert lines[0]["source"] == "trainer" and lines[0]["loss/importance_ratio"] == 1.5
    assert (tmp_path / "configs" / "trainer.toml").read_text().strip() == "max_steps = 2"


@pytest.mark.slow
def test_wandb_offline_run_holds_metric_keys(tmp_path):
    monitor = Monitor(tmp_path, "trainer", WandbConfig(mode="offline", project="test"), run_config={"a": 1})
    keys = ("loss/importance_ratio", "loss/soft_gate_weight")
    for step in range(3):
        monitor.log({key: 1.0 + step for key in keys}, step=step)
    monitor.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    assert wait_complete(runs[0])
    rows = history(runs[0])
    assert [row["_step"] for row in rows] == [0, 1, 2]
    assert [row["loss/soft_gate_weight"] for row in rows] == [1.0, 2.0, 3.0]
    assert all(key in row for row in rows for key in keys)


@pytest.mark.slow
def test_wandb_failure_does_not_stop_logging(tmp_path, monkeypatch, caplog):
    import wandb

    def broken_init(**kwargs):
        raise RuntimeError("no W&B today")

    monkeypatch.setattr(wandb, "init", broken_init)
    monitor = Monitor(tmp_path, "orchestrator", WandbConfig(mode="offline"))
    monitor.log({"reward/mean": 0.5}, step=0)
    assert (tmp_path / "metrics.jsonl").exists()
    assert monitor.wandb.run is None


def test_wandb_mode_default_follows_api_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_wandb_mode(WandbConfig()) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x")
    assert resolve_wandb_mode(WandbConfig()) == "online"
    assert resolve_wandb_mode(WandbConfig(mode="disabled")) == "disabled"


def test_resumed_monitor_drops_its_stale_steps_and_keeps_the_other_source(tmp_path):
    """Regression: after a resume, metrics.jsonl kept the old run's lines of the re-run steps."""
    first = Monitor(tmp_path, "trainer", WandbConfig(mode="disabled"))
    other = Monitor(tmp_path, "orchestrator", WandbConfig(mode="disabled"))
    for step in range(5):
        first.log({"loss/total": 1.0}, step)
        other.log({"reward/mean": 0.5}, step)
    resumed = Monitor(tmp_path, "trainer", WandbConfig(mode="disabled"), resume_step=3)
    for step in (3, 4):
        resumed.log({"loss/total": 2.0}, step)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trainer = [(r["step"], r["loss/total"]) for r in rows if r["source"] == "trainer"]
    assert trainer == [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0)]
    assert [r["step"] for r in rows if r["source"] == "orchestrator"] == [0, 1, 2, 3, 4]


@pytest.mark.slow  # a subprocess
def test_appends_are_not_lost_while_another_process_drops_stale_lines(tmp_path):
    """The resume rewrite and the appends of other processes share a lock: no appended line is lost."""
    import subprocess
    import sys

    from prime_rl.monitor.sinks import drop_steps_from

    path = tmp_path / "metrics.jsonl"
    code = (
        "import sys; from prime_rl.monitor import Monitor; from prime_rl.configs.shared import WandbConfig\n"
        "m = Monitor(sys.argv[1], 'trainer', WandbConfig(mode='disabled'), console=False)\n"
        "[m.log({'loss/total': 1.0}, i) for i in range(2000)]\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)])
    stale = Monitor(tmp_path, "orchestrator", WandbConfig(mode="disabled"), console=False)
    rewrites = 0
    while proc.poll() is None:
        stale.log({"reward/mean": 0.5}, 7)
        rewrites += drop_steps_from(path, 5, ("orchestrator",))
    assert proc.wait() == 0
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rewrites > 10  # the rewrites really overlapped the appends
    assert [r["step"] for r in rows if r["source"] == "trainer"] == list(range(2000))
    assert not [r for r in rows if r["source"] == "orchestrator"]


@pytest.mark.slow
def test_resumed_wandb_run_holds_every_step_once(tmp_path):
    """The resumed component's W&B run replays the surviving steps, then logs the re-run ones."""
    config = WandbConfig(mode="offline", project="test")
    first = Monitor(tmp_path, "trainer", config)
    for step in range(4):
        first.log({"loss/total": 1.0}, step)
    first.close()
    resumed = Monitor(tmp_path, "trainer", config, resume_step=2)
    for step in (2, 3):
        resumed.log({"loss/total": 2.0}, step)
    resumed.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and all(wait_complete(run) for run in runs)
    (rows,) = [run["history"] for run in map(read_run, runs) if run["name"].endswith("-trainer-resumed-2")]
    assert [(row["_step"], row["loss/total"]) for row in rows] == [(0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0)]

"""A W&B offline run is readable without W&B's service or an account: its config, summary and rows, from the run
directory, as a command (`python -m prime_rl.monitor.wandb_offline`)."""

from __future__ import annotations

import json

import pytest

from prime_rl.configs.shared import WandbConfig
from prime_rl.monitor.monitor import Monitor
from prime_rl.monitor.wandb_offline import CHUNK_HEADER, main, read_run, records, run_files, wait_complete


@pytest.mark.slow
def test_an_offline_runs_config_summary_and_rows_are_read_from_the_run_directory(tmp_path, capsys):
    monitor = Monitor(tmp_path, "trainer", WandbConfig(mode="offline", project="test"),
                      run_config={"max_steps": 3, "loss": {"type": "sapo"}})
    for step in range(3):
        monitor.log({"loss/total": 0.5 - 0.1 * step}, step=step)
    monitor.close()
    (run_file,) = run_files(tmp_path)
    assert wait_complete(run_file)
    run = read_run(run_file)
    assert [row["loss/total"] for row in run["history"]] == pytest.approx([0.5, 0.4, 0.3])
    assert json.dumps(run["config"]).count("sapo") == 1 and "max_steps" in json.dumps(run["config"])
    main([str(tmp_path)])
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"] == 3 and printed["complete"] and printed["summary"]["loss/total"] == pytest.approx(0.3)
    assert printed["name"] == f"{tmp_path.name}-trainer"

    # The same file as W&B's service leaves it before the stream closes: the last record (exit) not yet written.
    last = records(run_file)[-1]
    partial = tmp_path / "partial.wandb"
    partial.write_bytes(run_file.read_bytes()[:-len(last) - CHUNK_HEADER])
    assert not read_run(partial)["complete"] and len(read_run(partial)["history"]) == 3
    assert not wait_complete(partial, timeout_s=0.3)
    main([str(partial)])
    assert json.loads(capsys.readouterr().out)["complete"] is False


def test_a_directory_without_an_offline_run_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1

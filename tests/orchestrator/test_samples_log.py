"""A step's rollouts as readable JSON lines (`orchestrator/samples_log.py`): what each line holds, kept and dropped
groups, and the bounds (interval, fraction, size)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from prime_rl.envs.environment import Example, Rollout
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import SamplesConfig
from prime_rl.orchestrator.rollouts.scored_group import Group, TurnStats
from prime_rl.orchestrator.samples_log import SamplesFile, samples_jsonl


def group(name: str, rewards: list[float], text: str = "olleh") -> Group:
    completions = [RolloutCompletion([5, 6, 7], [-0.1] * 3, text, "length" if r < 0.5 else "stop", [3, 3, 4])
                   for r in rewards]
    return Group(name, Example([{"role": "user", "content": "reverse hello"}], "olleh", {"id": 7}),
                 ChatResult([1, 2], 3, completions), rewards, [{"lcs": r} for r in rewards],
                 [None if r else "respond raised KeyError" for r in rewards],
                 [TurnStats(turns=2, sampled_tokens=2, tool_calls=1) for _ in rewards],
                 rollouts=[Rollout([{"role": "assistant", "content": text}, {"role": "user", "content": "again"}])
                           for _ in rewards])


def lines(written: SamplesFile) -> list[dict]:
    return [json.loads(line) for line in written.data.decode().splitlines()]


def test_every_rollout_of_kept_and_dropped_groups_is_a_line_with_what_a_reader_needs():
    kept, dropped = group("reverse-text", [1.0, 0.0]), group("other", [0.5, 0.5])
    out = lines(samples_jsonl(SamplesConfig(), 6, [kept, dropped], [kept], torch.tensor([[0.5, -0.5]])))
    assert [(r["env"], r["group"], r["rollout"], r["kept"], r["advantage"]) for r in out] == [
        ("reverse-text", 0, 0, True, 0.5), ("reverse-text", 0, 1, True, -0.5),
        ("other", 1, 0, False, None), ("other", 1, 1, False, None)]
    first = out[0]
    assert first["prompt"] == [{"role": "user", "content": "reverse hello"}] and first["answer"] == "olleh"
    assert first["messages"][1] == {"role": "user", "content": "again"} and first["completion"] == "olleh"
    assert (first["reward"], first["components"], first["error"]) == (1.0, {"lcs": 1.0}, None)
    assert out[1]["error"] == "respond raised KeyError" and out[1]["truncated"] and not first["truncated"]
    assert (first["prompt_tokens"], first["completion_tokens"], first["sampled_tokens"]) == (2, 3, 2)
    assert (first["turns"], first["tool_calls"], first["segments"], first["policy_lag"]) == (2, 1, 1, 3)
    assert first["tokens"] == [{"key": 0, "ids": [5, 6, 7], "logprobs": [-0.1] * 3, "sampled": [True] * 3,
                                "weight_steps": [3, 3, 4]}]


def test_a_failed_rollout_left_out_of_its_kept_group_is_written_as_not_trained():
    kept = dataclasses.replace(group("reverse-text", [1.0, 0.0, 0.5]), exclude_failed=True)  # rollout 1 failed
    written = samples_jsonl(SamplesConfig(), 2, [kept], [kept], torch.tensor([[0.5, 0.0, -0.5]]))
    out = lines(written)
    assert [(r["kept"], r["advantage"], r["error"]) for r in out] == [
        (True, 0.5, None), (False, None, "respond raised KeyError"), (True, -0.5, None)]
    assert sorted(rollout for _, rollout, _ in written.keys) == [0, 2]  # no key reaches the trainer for rollout 1


def test_interval_fraction_and_size_bound_what_is_written():
    groups = [group(f"g{i}", [1.0, 0.0]) for i in range(3)]
    rows = torch.zeros((3, 2))
    assert samples_jsonl(SamplesConfig(interval=2), 3, groups, groups, rows) is None
    assert samples_jsonl(SamplesConfig(interval=0), 0, groups, groups, rows) is None
    assert len(lines(samples_jsonl(SamplesConfig(interval=2), 4, groups, groups, rows))) == 6
    assert {r["env"] for r in lines(samples_jsonl(SamplesConfig(fraction=0.5), 0, groups, groups, rows))} == {
        "g0", "g1"}  # ceil(0.5 x 3) groups, whole
    one_line = len(samples_jsonl(SamplesConfig(), 0, groups[:1], groups[:1], rows[:1]).data.splitlines()[0]) + 1
    capped = lines(samples_jsonl(SamplesConfig(max_mib=2.5 * one_line / 2**20), 0, groups, groups, rows))
    assert len(capped) == 3 and capped[-1] == {"step": 0, "left_out": 4}
    huge = group("big", [1.0], text="x" * 100_000)
    assert lines(samples_jsonl(SamplesConfig(max_mib=0.01), 0, [huge], [huge], rows[:1, :1])) == [
        {"step": 0, "left_out": 1}]


@pytest.mark.slow
def test_a_run_logs_its_samples_table_to_wandb_and_marks_steps_without_signal(tmp_path, monkeypatch):
    """An in-process run where no rollout can score (the reverse-text model never writes a box): every group's
    rewards are equal, each step says `advantage/no_signal` = 1, and each step's W&B samples table holds its first
    `wandb_rows` rollouts, readable offline."""
    from prime_rl.monitor.wandb_offline import run_files, tables, wait_complete
    from prime_rl.samples_summary import COLUMNS
    from tests.support import REPO
    from tests.support.rl_in_process import run_in_process

    monkeypatch.chdir(REPO)
    env = ('[{id = "dataset", args = {path = "examples/dataset/train.jsonl", extract = "none", '
           'rewards = {format_boxed = 1.0}}}]')
    run = run_in_process(["--output-dir", str(tmp_path / "run"), "--model.name", "tiny-reverse-text",
                          "--max-steps", "2", "--seq-len", "256", "--orchestrator.batch-size", "16",
                          "--orchestrator.sampling.max-tokens", "8", "--wandb.mode", "offline",
                          "--orchestrator.samples.wandb-interval", "1", "--orchestrator.samples.wandb-rows", "5",
                          "--orchestrator.env", env])
    assert [row["advantage/no_signal"] for _, row in sorted(run.rows("orchestrator").items())] == [1.0, 1.0]
    files = run_files(tmp_path / "run")
    assert all(wait_complete(f) for f in files)
    found = [t for f in files for t in tables(f, "samples")]
    assert [t["step"] for t in found] == [0, 1]
    assert all(t["columns"] == list(COLUMNS) and len(t["data"]) == 5 for t in found)


def test_the_wandb_table_comes_from_steps_that_write_samples():
    from pydantic import ValidationError

    assert SamplesConfig(interval=2, wandb_interval=4).wandb_interval == 4
    for interval, wandb_interval in ((2, 3), (0, 1)):
        with pytest.raises(ValidationError, match="must be a multiple of interval"):
            SamplesConfig(interval=interval, wandb_interval=wandb_interval)


def test_a_full_disk_while_writing_samples_fails_loudly_and_leaves_the_run_as_it_was(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    from prime_rl.batch_format import write_step
    from prime_rl.models.sampling_rule import SamplingRule
    from prime_rl.orchestrator.batch import Sample, pack_batch
    from prime_rl.run_dir import checkpoint_dir, metrics_file, rollout_dir, samples_file

    metrics_file(tmp_path).write_text('{"step": 0}\n')
    checkpoint_dir(tmp_path, 1, "orchestrator").mkdir(parents=True)
    (checkpoint_dir(tmp_path, 1, "orchestrator") / "state.json").write_text("{}")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    batches = pack_batch([Sample([1, 2], [3, 4], [-0.1, -0.2], 1.0, 0)], 64, 1, 1, SamplingRule(), 8)
    real = Path.write_bytes

    def full(self, data):
        if self.name == samples_file(self.parent).name:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError, match="No space left on device"):
        write_step(tmp_path, 1, batches, b'{"step": 1}\n')
    assert not rollout_dir(tmp_path, 1).exists()  # the step's batch is not there either: the trainer waits
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing else touched

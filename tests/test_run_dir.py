"""The run directory's checkpoint rules: complete steps, 'latest', retention, leftovers of killed writes."""

from __future__ import annotations

import pytest

from prime_rl.run_dir import (
    complete_steps,
    prune_checkpoints,
    remove_temporaries,
    resolve_resume_step,
)
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import list_steps


def make(run, step, *parts):
    for part in parts:
        (run / "checkpoints" / f"step_{step}" / part).mkdir(parents=True)


@pytest.mark.parametrize("keep", [1, 2, 3])
@pytest.mark.parametrize("ahead", [1, 2, 3])  # max_async_level + 1: orchestrator parts without a trainer partner
def test_retention_counts_complete_checkpoints_and_keeps_the_parts_ahead(tmp_path, keep, ahead):
    """Regression: keep counted every step_N folder, so the orchestrator's parts ahead of the
    trainer made the trainer delete its own newest checkpoint and 'latest' found none."""
    trained = 6
    for step in range(1, trained + 1):
        make(tmp_path, step, "trainer", "orchestrator")
    for step in range(trained + 1, trained + 1 + ahead):
        make(tmp_path, step, "orchestrator")
    prune_checkpoints(tmp_path, keep)
    assert complete_steps(tmp_path) == list(range(trained - keep + 1, trained + 1))
    assert list_steps(tmp_path / "checkpoints") == list(range(trained - keep + 1, trained + 1 + ahead))
    assert resolve_resume_step(tmp_path, "latest") == trained


def test_retention_without_a_partner_process(tmp_path):
    """sft, or a trainer run by hand: its own parts are the complete checkpoints."""
    for step in (2, 4, 6):
        make(tmp_path, step, "trainer")
    prune_checkpoints(tmp_path, 1)
    assert list_steps(tmp_path / "checkpoints") == [6]
    prune_checkpoints(tmp_path, None)
    assert list_steps(tmp_path / "checkpoints") == [6]


def test_the_orchestrator_never_prunes_the_step_the_trainer_writes_its_first_checkpoint_into(tmp_path):
    """Regression (seen in CI): with keep = 1, the orchestrator's checkpoints of steps 1 and 2 were 'complete'
    while the trainer's first one was still being written into step_1/.trainer.tmp, and step_1 went."""
    make(tmp_path, 1, "orchestrator", ".trainer.tmp")
    make(tmp_path, 2, "orchestrator")
    prune_checkpoints(tmp_path, 1, parts=("trainer", "orchestrator"))
    assert list_steps(tmp_path / "checkpoints") == [1, 2]
    assert (tmp_path / "checkpoints" / "step_1" / ".trainer.tmp").is_dir()
    prune_checkpoints(tmp_path, 1)  # judged by the parts found, step 1 would have gone
    assert list_steps(tmp_path / "checkpoints") == [2]


def test_a_stale_half_checkpoint_older_than_the_kept_ones_goes(tmp_path):
    make(tmp_path, 1, "trainer")  # its orchestrator part was lost
    make(tmp_path, 2, "trainer", "orchestrator")
    make(tmp_path, 3, "trainer", "orchestrator")
    prune_checkpoints(tmp_path, 1)
    assert list_steps(tmp_path / "checkpoints") == [3]


def test_a_writer_killed_while_pruning_leaves_no_half_deleted_step(tmp_path, monkeypatch):
    """Regression (seen in CI): the orchestrator killed inside rmtree of step_4 left step_4/orchestrator/ without
    its trainer part; a step being pruned is renamed away first, and what is left is a temporary for the next
    start's cleanup."""
    for step in (4, 8, 9):
        make(tmp_path, step, "trainer", "orchestrator")

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt  # the process dies inside the deletion

    monkeypatch.setattr("prime_rl.utils.fs.shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(tmp_path, 2)
    monkeypatch.undo()
    assert list_steps(tmp_path / "checkpoints") == [8, 9]
    assert [p.name for p in remove_temporaries(tmp_path)][0].startswith(".step_4.")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_8", "step_9"]


def test_resume_step_rules(tmp_path):
    assert resolve_resume_step(tmp_path, None) is None
    with pytest.raises(UserError, match="no complete checkpoint"):
        resolve_resume_step(tmp_path, "latest")
    make(tmp_path, 2, "trainer", "orchestrator")
    make(tmp_path, 3, "orchestrator")
    make(tmp_path, 4, "trainer")
    assert resolve_resume_step(tmp_path, "latest") == 2
    assert resolve_resume_step(tmp_path, 2) == 2
    with pytest.raises(UserError, match=r"resume_step = 3: .*complete steps: 2\)"):
        resolve_resume_step(tmp_path, 3)


def test_remove_temporaries_of_interrupted_writes(tmp_path):
    leftovers = [
        tmp_path / "rollouts" / ".step_3.abc123.tmp",
        tmp_path / "weights" / ".step_4.xyz.tmp",
        tmp_path / "checkpoints" / "step_4" / ".trainer.tmp",
        tmp_path / "checkpoints" / "step_5" / ".orchestrator.q1w2.tmp",
    ]
    for path in leftovers:
        (path / "inner").mkdir(parents=True)
    (tmp_path / ".metrics.png.k9.tmp").write_text("half a png")
    kept = [tmp_path / "rollouts" / "step_2", tmp_path / "weights" / "step_3", tmp_path / "checkpoints" / "step_4"
            / "trainer", tmp_path / "weights" / "step_3.tmp"]
    for path in kept:
        path.mkdir(parents=True, exist_ok=True)
    removed = remove_temporaries(tmp_path)
    assert len(removed) == 5
    assert not any(p.exists() for p in leftovers) and not (tmp_path / ".metrics.png.k9.tmp").exists()
    assert all(p.exists() for p in kept)


def test_rl_needs_both_parts_even_when_the_trainer_never_checkpointed(tmp_path):
    """Regression: the trainer's first save hit a full disk; the orchestrator's steps
    alone looked complete and 'latest' resumed from a step without trainer state."""
    make(tmp_path, 2, "orchestrator")
    make(tmp_path, 4, "orchestrator")
    assert complete_steps(tmp_path) == [2, 4]  # a run of orchestrator parts alone
    assert complete_steps(tmp_path, ("trainer", "orchestrator")) == []
    with pytest.raises(UserError, match="holds no complete checkpoint"):
        resolve_resume_step(tmp_path, "latest", ("trainer", "orchestrator"))

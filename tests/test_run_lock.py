"""The run directory's lock: rl and sft alone; a hand-started trainer and orchestrator side by side, never beside a
running rl; the components rl starts do not lock again."""

from __future__ import annotations

import pytest

from prime_rl import run_lock
from prime_rl.configs.cli import run_main
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.utils.errors import ConfigError


def started(config_cls, out, monkeypatch, body=None) -> str | int:
    """Run `config_cls`'s entrypoint shape on `out` with `body` (default: note that it ran); 'ran' or the exit
    code."""
    ran = []
    try:
        run_main(config_cls, body or (lambda config: ran.append(config)), ["--output-dir", str(out)])
    except SystemExit as exc:
        return exc.code
    return "ran" if ran or body else "nothing"


def test_a_hand_started_component_beside_a_running_rl_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    """A trainer started by hand in the directory of a running rl wrote beside that rl's own trainer; it is one line,
    exit 2, and its body never runs."""
    monkeypatch.delenv(run_lock.HELD_BY_PARENT_ENV, raising=False)
    held = run_lock.take(tmp_path, "rl")
    try:
        for config_cls in (TrainerConfig, OrchestratorConfig, SFTConfig):
            assert started(config_cls, tmp_path, monkeypatch) == 2
            assert f"output dir {tmp_path} is in use by a running rl (pid" in capsys.readouterr().err
    finally:
        held.release()


def test_the_trainer_and_orchestrator_started_by_hand_share_the_directory_and_keep_rl_and_sft_out(tmp_path,
                                                                                               monkeypatch, capsys):
    monkeypatch.delenv(run_lock.HELD_BY_PARENT_ENV, raising=False)

    def orchestrator_body(config):
        assert started(TrainerConfig, tmp_path, monkeypatch) == "ran"  # side by side
        with pytest.raises(ConfigError, match="in use by a running (orchestrator|trainer)"):
            run_lock.take(tmp_path, "rl")  # what rl's prepare_run_dir takes
        assert started(SFTConfig, tmp_path, monkeypatch) == 2

    assert started(OrchestratorConfig, tmp_path, monkeypatch, orchestrator_body) == "ran"
    run_lock.take(tmp_path, "rl").release()  # gone with the orchestrator


def test_the_components_rl_starts_do_not_lock_again(tmp_path, monkeypatch):
    """rl holds the lock for its children (and says so in their environment): its trainer and orchestrator start."""
    monkeypatch.setenv(run_lock.HELD_BY_PARENT_ENV, "rl (pid 1)")
    held = run_lock.take(tmp_path, "rl")
    try:
        assert started(TrainerConfig, tmp_path, monkeypatch) == "ran"
        assert started(OrchestratorConfig, tmp_path, monkeypatch) == "ran"
    finally:
        held.release()


def test_an_output_dir_that_cannot_be_made_is_left_to_the_components_own_write(tmp_path, monkeypatch):
    monkeypatch.delenv(run_lock.HELD_BY_PARENT_ENV, raising=False)
    (tmp_path / "file").write_text("x")
    assert run_lock.take_for_component(tmp_path / "file" / "run", "trainer", shared=True) is None


def test_a_filesystem_without_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch, capsys):
    """Some NFS mounts refuse flock (ENOLCK): the run goes on, and says that a second run would not be refused."""
    def no_locks(fd, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_locks)
    run_lock.take(tmp_path, "rl").release()
    assert "warning: cannot lock" in capsys.readouterr().err


def test_only_rank_0_of_a_torchrun_job_locks_so_an_exclusive_sft_runs_on_several_ranks(tmp_path, monkeypatch):
    """`torchrun --nproc-per-node 2 -m prime_rl.trainer.sft.train`: every rank took the exclusive lock, so rank 1
    was refused by rank 0 and the job died. Ranks other than 0 belong to rank 0's run."""
    monkeypatch.delenv(run_lock.HELD_BY_PARENT_ENV, raising=False)
    monkeypatch.setenv("RANK", "0")
    rank0 = run_lock.take_for_component(tmp_path, "sft", shared=False)
    try:
        monkeypatch.setenv("RANK", "1")
        assert started(SFTConfig, tmp_path, monkeypatch) == "ran"
        monkeypatch.setenv("RANK", "0")
        assert started(SFTConfig, tmp_path, monkeypatch) == 2  # a second job's rank 0 is refused
    finally:
        rank0.release()


def test_the_lock_is_released_when_the_body_fails(tmp_path, monkeypatch):
    monkeypatch.delenv(run_lock.HELD_BY_PARENT_ENV, raising=False)

    def fails(config):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        run_main(TrainerConfig, fails, ["--output-dir", str(tmp_path)])
    run_lock.take(tmp_path, "rl").release()  # nothing holds it any more

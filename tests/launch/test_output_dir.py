"""`rl`'s run directory: the marker, what --overwrite deletes, and that every check comes before any deletion."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tomllib

import pytest

from prime_rl import run_lock
from prime_rl.configs.cli import build_config
from prime_rl.launch import output_dir
from prime_rl.launch.output_dir import check_writable, delete, mark, plan
from prime_rl.launch.processes import Child
from prime_rl.launch.rl import launch
from prime_rl.launch.rl_config import RLConfig
from prime_rl.run_dir import MARKER, RUN_ARTIFACTS, RUN_LOCK
from prime_rl.utils.checksums import write_manifest
from prime_rl.utils.errors import ConfigError


def previous_run(out, marked=True):
    """A finished rl run (every artifact, a leftover temporary) with the user's own files beside it."""
    for name in ("rollouts", "weights", "checkpoints", "logs", "configs", "wandb", "viewer_steps"):
        (out / name / "step_1").mkdir(parents=True)
        (out / name / "step_1" / "f").write_text("run")
    for name in ("metrics.jsonl", "metrics.jsonl.lock", "metrics.png", "viewer.html", ".metrics.jsonl.x1y2.tmp"):
        (out / name).write_text("run")
    (out / "notes.md").write_text("mine")
    (out / ".notes.tmp").write_text("mine too")  # looks temporary, but no run file is named like it
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("mine")
    if marked:
        mark(out, "rl")


def user_files(out):
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {MARKER, RUN_LOCK}


MINE = {"notes.md", ".notes.tmp", "analysis/plot.py"}


def test_missing_or_empty_dir_starts_fresh(tmp_path):
    assert plan(tmp_path / "nope", overwrite=True, resuming=False) == []
    assert plan(tmp_path, overwrite=True, resuming=False) == []
    assert plan(tmp_path, overwrite=False, resuming=False) == []


def test_overwrite_deletes_exactly_the_marked_runs_artifacts(tmp_path):
    previous_run(tmp_path)
    doomed = plan(tmp_path, overwrite=True, resuming=False)
    assert {p.name for p in doomed} == {*RUN_ARTIFACTS, ".metrics.jsonl.x1y2.tmp", MARKER}
    delete(doomed)
    assert user_files(tmp_path) == MINE
    assert not (tmp_path / MARKER).exists()


def test_overwrite_refuses_a_directory_without_the_marker(tmp_path):
    (tmp_path / "thesis.tex").write_text("mine")
    (tmp_path / "logs").mkdir()
    with pytest.raises(ConfigError, match=rf"--overwrite deletes only what an rl run wrote, and {tmp_path} has no "
                                          rf"\.prime-rl-run marker of one \(it holds logs, thesis\.tex\)"):
        plan(tmp_path, overwrite=True, resuming=False)
    assert (tmp_path / "thesis.tex").exists() and (tmp_path / "logs").is_dir()


def test_overwrite_refuses_an_unmarked_run_from_before_the_marker(tmp_path):
    previous_run(tmp_path, marked=False)
    with pytest.raises(ConfigError, match="no .prime-rl-run marker"):
        plan(tmp_path, overwrite=True, resuming=False)


@pytest.mark.parametrize("marked", [True, False])
def test_resume_needs_no_marker_and_deletes_nothing(tmp_path, marked):
    previous_run(tmp_path, marked)
    assert plan(tmp_path, overwrite=False, resuming=True) == []


@pytest.mark.parametrize("marked", [True, False])
def test_an_existing_run_needs_resume_or_overwrite(tmp_path, marked):
    previous_run(tmp_path, marked)
    with pytest.raises(ConfigError, match="already holds a run"):
        plan(tmp_path, overwrite=False, resuming=False)


def test_a_fresh_run_may_start_beside_unrelated_files(tmp_path):
    (tmp_path / "notes.md").write_text("mine")
    assert plan(tmp_path, overwrite=False, resuming=False) == []


def test_check_writable_creates_the_dir_and_leaves_no_probe(tmp_path):
    check_writable(tmp_path / "a" / "b")
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_check_writable_failure_is_one_line(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output_dir.tempfile, "NamedTemporaryFile", full)
    with pytest.raises(ConfigError, match=rf"^cannot write {tmp_path}: no space left on device$"):
        check_writable(tmp_path)


def test_marker_records_its_writer(tmp_path):
    mark(tmp_path, "rl")
    record = json.loads((tmp_path / MARKER).read_text())
    assert record["written_by"] == "prime-rl rl" and record["artifacts"] == list(RUN_ARTIFACTS)


# ---------------------------------------------------------------------------- through launch()


def rl_config(out, *extra):
    return build_config(RLConfig, ["--output-dir", str(out), "--wandb.mode", "disabled", *extra])[0]


@pytest.fixture
def no_children(monkeypatch):
    """launch() up to the first process start, which acts as Ctrl-C (nothing is started)."""
    def interrupt(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Child, "start", interrupt)
    monkeypatch.setattr(signal, "signal", lambda *args: None)


@pytest.mark.parametrize("late_error", [
    ["--deployment.inference-gpu-ids", "[99]"],  # a device check (no such GPU / no GPU at all)
    ["--inference.host", "no-such-host.invalid"],  # a host that does not resolve (RFC 6761 .invalid)
    ["--inference.host", "192.0.2.1"],  # an address of no local interface (TEST-NET-1)
])
def test_overwrite_with_a_failing_launch_check_deletes_nothing(tmp_path, no_children, late_error):
    previous_run(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError):
        launch(rl_config(tmp_path, "--overwrite", *late_error))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("backend", [["--inference.backend", "vllm"],
                                     ["--teacher.model.name", "tiny-reverse-text", "--teacher.backend", "vllm"]])
def test_overwrite_with_vllm_missing_deletes_nothing_and_names_the_server(tmp_path, no_children, monkeypatch,
                                                                            backend):
    """Regression: without vLLM installed the old run was deleted and the trainer started before the inference
    child failed (exit 1); now a one-line ConfigError (exit 2) before anything changes."""
    monkeypatch.setattr("prime_rl.launch.plan.vllm_available", lambda: False)
    previous_run(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    server = "teacher" if "--teacher.backend" in backend else "inference"
    with pytest.raises(ConfigError, match=rf"^{server} server: backend 'vllm' needs vLLM: install the 'vllm' extra"):
        launch(rl_config(tmp_path, "--overwrite", *backend))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_a_second_rl_where_a_run_goes_on_is_refused_naming_it_and_a_dead_runs_lock_never_blocks(tmp_path,
                                                                                              no_children):
    """Regression: `rl --overwrite` on a directory whose run was still going deleted it under the live run. The
    running rl (here another process holding the lock) is named; once it is gone its lock file stays but no
    longer blocks."""
    previous_run(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
         "os.write(fd, b'rl (pid %d)' % os.getpid())\nprint('held', flush=True)\ntime.sleep(120)",
         str(tmp_path / RUN_LOCK)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=rf"^output dir {tmp_path} is in use by a running rl \(pid "
                                              rf"{holder.pid}\): let it finish or stop it first"):
            launch(rl_config(tmp_path, "--overwrite"))
        after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != RUN_LOCK}
        assert after == before
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(SystemExit):  # the holder died: its lock went with it; this rl starts (and is interrupted)
        launch(rl_config(tmp_path, "--overwrite"))
    assert (tmp_path / "notes.md").read_text() == "mine" and not (tmp_path / "rollouts").exists()
    held = run_lock.take(tmp_path, "rl")  # released by that rl when it stopped
    held.release()


def test_the_interrupt_hint_says_what_can_be_resumed(tmp_path, no_children, capsys):
    """Regression: after Ctrl-C the hint always said --ckpt.resume-step latest, which fails when no checkpoint was
    ever written (none yet at the default ckpt.interval = 50)."""
    with pytest.raises(SystemExit):
        launch(rl_config(tmp_path / "run"))
    raw = capsys.readouterr().out
    start = next(line for line in raw.splitlines() if line.startswith("rl: outputs in"))
    assert len(start) > 80 and start.endswith("logs"), start  # off a terminal a line stays one line (was cut at 80)
    out = " ".join(raw.split())
    assert "No checkpoint was written (ckpt.interval = 50: the first after step 50), so nothing can be resumed: run " \
        "again with --overwrite" in out and "--ckpt.resume-step" not in out
    for part in ("trainer", "orchestrator"):
        (tmp_path / "run" / "checkpoints" / "step_2" / part).mkdir(parents=True)
        write_manifest(tmp_path / "run" / "checkpoints" / "step_2" / part)
    with pytest.raises(SystemExit):
        launch(rl_config(tmp_path / "run", "--ckpt.resume-step", "latest"))
    assert "Continue with --ckpt.resume-step latest (checkpoint step 2 of" in " ".join(capsys.readouterr().out.split())


def test_the_interrupt_hint_is_printed_when_ctrl_c_cut_a_print_short(tmp_path, monkeypatch, capsys):
    """Regression (seen in CI): Ctrl-C landed inside rich's print of a step line, whose console then held every later
    print in its buffer: rl exited 130 with no hint. The hint goes through a fresh console."""
    from prime_rl.launch import rl

    def interrupted_mid_print(self):
        rl_console = consoles[0]
        rl_console._enter_buffer()  # what print does first; the interrupt comes before its _exit_buffer
        raise KeyboardInterrupt

    consoles = []
    real = rl.Console
    monkeypatch.setattr(rl, "Console", lambda *a, **k: consoles.append(real(*a, **k)) or consoles[-1])
    monkeypatch.setattr(Child, "start", interrupted_mid_print)
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    with pytest.raises(SystemExit) as exit_info:
        launch(rl_config(tmp_path / "run"))
    assert exit_info.value.code == 130
    assert "interrupted; all components stopped. No checkpoint was written" in " ".join(capsys.readouterr().out.split())


def test_overwrite_with_a_resume_step_is_a_load_error(tmp_path):
    with pytest.raises(ConfigError, match="overwrite deletes the run that ckpt.resume_step continues"):
        rl_config(tmp_path, "--overwrite", "--ckpt.resume-step", "3")


def test_launch_replaces_a_marked_run_and_marks_the_new_one(tmp_path, no_children, capsys):
    previous_run(tmp_path)
    with pytest.raises(SystemExit):
        launch(rl_config(tmp_path, "--overwrite"))
    assert user_files(tmp_path) - {p for p in user_files(tmp_path) if p.startswith("configs/")} == MINE
    assert (tmp_path / MARKER).is_file()
    rl_toml = tomllib.loads((tmp_path / "configs" / "rl.toml").read_text())
    assert "overwrite" not in rl_toml  # re-running the recorded config must not delete this run
    assert rl_toml["output_dir"] == str(tmp_path)


def test_launch_marks_a_new_dir_and_an_old_unmarked_run_it_resumes(tmp_path, no_children):
    with pytest.raises(SystemExit):
        launch(rl_config(tmp_path / "new"))
    assert (tmp_path / "new" / MARKER).is_file()
    old = tmp_path / "old"
    for part in ("trainer", "orchestrator"):
        (old / "checkpoints" / "step_2" / part).mkdir(parents=True)
        write_manifest(old / "checkpoints" / "step_2" / part)  # as every checkpoint has (verified before resuming)
    with pytest.raises(SystemExit):
        launch(rl_config(old, "--ckpt.resume-step", "latest"))
    assert (old / MARKER).is_file() and (old / "checkpoints" / "step_2" / "trainer").is_dir()


def test_overwrite_with_the_configured_port_in_use_deletes_nothing(tmp_path, no_children):
    """Regression: the busy port was found by the server after the old run was deleted."""
    import socket

    previous_run(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"^inference.port {port} on '127.0.0.1': cannot listen there"):
            launch(rl_config(tmp_path, "--overwrite", "--inference.port", str(port)))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_the_recorded_rl_toml_runs_again_with_other_shared_values(tmp_path, no_children):
    """Regression: the component sections held the handed-down keys, so `rl @ configs/rl.toml --max-steps 9` was
    "'orchestrator.max_steps' = 3 contradicts the shared value 9"."""
    teacher = ["--teacher.model.name", "tiny-reverse-text", "--max-async-level", "2",
               "--weight-transfer.timeout-s", "9"]
    with pytest.raises(SystemExit):
        launch(rl_config(tmp_path, "--max-steps", "3", "--orchestrator.advantage.type", "rloo", *teacher))
    recorded = tmp_path / "configs" / "rl.toml"
    again = build_config(RLConfig, ["@", str(recorded), "--max-steps", "9", "--seq-len", "300"])[0]
    first = rl_config(tmp_path, "--max-steps", "9", "--seq-len", "300", "--orchestrator.advantage.type", "rloo",
                      *teacher)
    for name in ("inference", "orchestrator", "trainer"):
        assert getattr(again, name).model_dump() == getattr(first, name).model_dump(), name
    assert again.orchestrator.teacher.base_url is None  # rl starts a teacher server again
    # Launch-time choices and defaults are not pinned: a free port and the matched dtype are chosen again.
    assert "port" not in again.inference.model_fields_set and "dtype" not in again.inference.builtin.model_fields_set
    assert again.ckpt.resume_step is None

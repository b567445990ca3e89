"""Launcher pieces: output-dir rules, metrics tailing, plot, and child process cleanup."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from prime_rl.configs.cli import build_config
from prime_rl.launch.plan import prepare_output_dir
from prime_rl.launch.processes import Child, stop_all
from prime_rl.launch.rl_config import RLConfig
from prime_rl.run_dir import MARKER
from prime_rl.run_report import MetricsTail, summary_lines, write_plot
from prime_rl.utils.errors import ConfigError, UserError


def rl_config(tmp_path, *extra):
    return build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), *extra])[0]


def test_existing_run_needs_resume_or_overwrite(tmp_path):
    config = rl_config(tmp_path)
    (tmp_path / "run" / "weights" / "step_1").mkdir(parents=True)
    (tmp_path / "run" / MARKER).write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run"):
        prepare_output_dir(config)
    assert prepare_output_dir(rl_config(tmp_path, "--ckpt.resume-step", "latest")) == []
    # prepare_output_dir only plans (tests/launch/test_output_dir.py covers the deletion rules)
    assert set(prepare_output_dir(rl_config(tmp_path, "--overwrite"))) == {config.output_dir / "weights",
                                                                           config.output_dir / MARKER}
    assert (tmp_path / "run" / "weights").exists()


@pytest.mark.parametrize("trained", [None, "weights", "checkpoints", "trainer line"])
def test_a_run_that_trained_no_step_is_replaced_without_overwrite(tmp_path, trained):
    """Regression: a run that failed to start or was stopped before its first step needed --overwrite before the
    same command could run again. It is replaced as --overwrite would (its configs, logs, orchestrator lines);
    once any step trained, the run is kept and the command refused."""
    run = tmp_path / "run"
    for name in ("configs", "logs", "rollouts/step_0"):
        (run / name).mkdir(parents=True)
    (run / MARKER).write_text("{}")
    lines = [{"step": 0, "source": "orchestrator", "x": 1.0}]
    if trained == "trainer line":
        lines.append({"step": 0, "source": "trainer", "x": 1.0})
    elif trained is not None:
        (run / trained / "step_1").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 1, "so')
    if trained is None:
        doomed = {p.name for p in prepare_output_dir(rl_config(tmp_path))}
        assert doomed == {"configs", "logs", "rollouts", "metrics.jsonl", MARKER}
    else:
        with pytest.raises(ConfigError, match="already holds a run"):
            prepare_output_dir(rl_config(tmp_path))


def test_metrics_tail_reads_only_complete_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    tail.poll()  # no file yet
    line = json.dumps({"step": 0, "source": "orchestrator", "time": 1.0, "reward/mean": 0.25})
    path.write_text(line + "\n" + '{"step": 1, "source": "orch')
    tail.poll()
    assert tail.get("orchestrator", "reward/mean") == {0: 0.25}
    with open(path, "a") as f:
        f.write('estrator", "reward/mean": 0.5}\n')
    tail.poll()
    assert tail.last("orchestrator", "reward/mean") == (1, 0.5)


def test_plot_and_summary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for step in range(4):
            f.write(json.dumps({"step": step, "source": "orchestrator", "reward/mean": 0.1 * step}) + "\n")
            f.write(json.dumps({"step": step, "source": "trainer", "loss/importance_ratio": 1.0,
                                "loss/soft_gate_weight": 0.9}) + "\n")
    tail = MetricsTail(path)
    tail.poll()
    assert write_plot(tail, tmp_path / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    text = "\n".join(summary_lines(tail, 12.0, tmp_path))
    assert "steps trained: 4" in text and "0.000 (step 1) -> 0.300 (step 4)" in text  # 1-based, as the progress


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purposes
        return f.read().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups checked via /proc")
def test_stop_all_kills_grandchildren(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(600)\n"
    )
    child = Child("worker", [sys.executable, "-c", script], tmp_path / "worker.log", dict(os.environ))
    child.start()
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    stop_all([child], grace_s=2)
    time.sleep(0.2)
    assert not _alive(child.process.pid)
    assert not _alive(grandchild)


def test_resume_latest_pins_the_newest_complete_checkpoint_and_drops_later_files(tmp_path):
    from prime_rl.launch.plan import clear_after, resume_step

    def resume_from(config):
        step = resume_step(config)
        if step is not None:
            clear_after(config, step)
        return step

    run = tmp_path / "run"
    for step, parts in ((2, ("trainer", "orchestrator")), (3, ("trainer", "orchestrator")), (4, ("trainer",))):
        for part in parts:
            (run / "checkpoints" / f"step_{step}" / part).mkdir(parents=True)
    for step in range(6):
        (run / "rollouts" / f"step_{step}").mkdir(parents=True)
        (run / "weights" / f"step_{step}").mkdir(parents=True)
    (run / "rollouts" / ".step_6.k2j3.tmp").mkdir()  # a write the interrupted run did not finish
    (run / "checkpoints" / "step_4" / ".trainer.tmp").mkdir()
    lines = [{"step": s, "source": src, "x": 1.0} for s in range(6) for src in ("trainer", "orchestrator")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 5, "sou')
    config = rl_config(tmp_path, "--ckpt.resume-step", "latest")
    assert resume_from(config) == 3
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_0", "step_1", "step_2"]
    assert sorted(p.name for p in (run / "weights").iterdir()) == ["step_0", "step_1", "step_2", "step_3"]
    assert not (run / "checkpoints" / "step_4" / ".trainer.tmp").exists()
    # Steps >= 3 are re-run: their old metric lines go (and the torn last line), nothing else.
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["source"]) for r in rows] == [
        (s, src) for s in range(3) for src in ("trainer", "orchestrator")]
    with pytest.raises(UserError, match="complete steps: 2, 3"):
        resume_from(rl_config(tmp_path, "--ckpt.resume-step", "4"))
    assert resume_from(rl_config(tmp_path)) is None


@pytest.mark.parametrize(("wanted", "kept"), [("latest", [8, 9]), ("4", [4]), ("8", [4, 8])])
def test_a_resume_applies_retention_and_abandons_the_checkpoints_after_its_step(tmp_path, wanted, kept):
    """Regression (seen in CI): the orchestrator killed after writing step 9 and before pruning left 3 checkpoints
    with keep = 2, and the resumed run, which had no step left to checkpoint, never pruned. A resume from an older
    step abandons the later checkpoints (kept, 'latest' would later go back to the abandoned run, and retention
    would count them against the new ones)."""
    from prime_rl.launch.plan import clear_after, resume_step

    run = tmp_path / "run"
    for step in (4, 8, 9):
        for part in ("trainer", "orchestrator"):
            (run / "checkpoints" / f"step_{step}" / part).mkdir(parents=True)
    (run / "checkpoints" / "step_10" / "orchestrator").mkdir(parents=True)  # written ahead of the trainer
    config = rl_config(tmp_path, "--ckpt.resume-step", wanted, "--ckpt.keep", "2")
    clear_after(config, resume_step(config))
    assert sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").iterdir()) == kept


def test_a_damaged_resume_checkpoint_is_refused_before_anything_is_discarded(tmp_path):
    """A truncated shard in the checkpoint to resume from: the explicit step and 'latest' (which resolves to it)
    both fail in one line naming the file, and the run directory is as it was, so the earlier checkpoint still
    resumes with every metrics line of the steps before it."""
    from prime_rl.launch.plan import plan_run, prepare_run_dir
    from prime_rl.utils.checksums import CorruptCheckpoint, write_manifest

    run = tmp_path / "run"
    for step in (2, 4):
        for part in ("trainer", "orchestrator"):
            part_dir = run / "checkpoints" / f"step_{step}" / part
            part_dir.mkdir(parents=True)
            (part_dir / "shard.bin").write_bytes(bytes(range(256)) * 8)
            write_manifest(part_dir)
    for step in range(6):
        (run / "rollouts" / f"step_{step}").mkdir(parents=True)
        (run / "weights" / f"step_{step}").mkdir(parents=True)
    lines = [{"step": s, "source": src, "x": 1.0} for s in range(6) for src in ("trainer", "orchestrator")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    shard = run / "checkpoints" / "step_4" / "trainer" / "shard.bin"
    shard.write_bytes(shard.read_bytes()[:100])  # a shard cut short (a full disk, a killed copy)

    def state() -> dict:
        return {p: (p.read_bytes() if p.is_file() else None) for p in run.rglob("*")}

    before = state()
    for wanted in ("4", "latest"):
        with pytest.raises(CorruptCheckpoint, match=f"checkpoint file {shard} is truncated"):
            plan_run(rl_config(tmp_path, "--ckpt.resume-step", wanted))
        assert state() == before, wanted
    plan = plan_run(rl_config(tmp_path, "--ckpt.resume-step", "2"))
    prepare_run_dir(plan)
    assert plan.resumed == 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [0, 1]


def test_the_plan_resumes_every_part_from_one_pinned_step_and_leaves_the_loaded_config_alone(tmp_path, monkeypatch):
    from prime_rl.launch import plan

    run = tmp_path / "run"
    for step, parts in ((2, ("trainer", "orchestrator")), (3, ("trainer",))):  # step 3 is incomplete
        for part in parts:
            (run / "checkpoints" / f"step_{step}" / part).mkdir(parents=True)
    (run / MARKER).write_text("{}")
    monkeypatch.setattr(plan, "verify_resume_checkpoint", lambda config, step: None)  # no manifests here
    loaded = rl_config(tmp_path, "--ckpt.resume-step", "latest")
    before = loaded.model_dump()
    planned = plan.plan_run(loaded).config
    assert planned.ckpt.resume_step == planned.trainer.ckpt.resume_step == planned.orchestrator.ckpt.resume_step == 2
    assert planned.inference.port != 0 and str(planned.inference.port) in planned.orchestrator.client.base_url
    assert loaded.model_dump() == before
    assert "resume_step" not in planned.trainer.ckpt.model_fields_set  # filled in, not set by the user


@pytest.mark.parametrize("on_gpu, extra, builtin, vllm", [
    (False, [], "float32", "float32"),
    (True, [], "bfloat16", "bfloat16"),  # the trainer computes in bf16 mixed precision there
    (True, ["--trainer.runtime.dtype", "float32"], "float32", "float32"),
    (True, ["--inference.builtin.dtype", "float16", "--inference.vllm.dtype", "half"], "float16", "half"),  # the user's
])
def test_inference_computes_in_the_trainers_dtype_unless_set(tmp_path, on_gpu, extra, builtin, vllm):
    from prime_rl.configs.base import with_values
    from prime_rl.launch.plan import inference_dtypes

    config = rl_config(tmp_path, *extra)
    config = with_values(config, inference_dtypes(config, trainer_on_gpu=on_gpu))
    assert (config.inference.builtin.dtype, config.inference.vllm.dtype) == (builtin, vllm)


def test_policy_servers_get_equal_gpu_shares(tmp_path):
    from prime_rl.launch.plan import split_devices

    assert split_devices("", 3) == ["", "", ""]
    assert split_devices("0,1,2,3", 2) == ["0,1", "2,3"]
    with pytest.raises(ConfigError, match="num_servers = 3 does not divide the 4 inference GPU"):
        split_devices("0,1,2,3", 3)


def test_a_fresh_dir_holding_only_a_server_nodes_or_slurm_files_may_be_overwritten(tmp_path):
    config = rl_config(tmp_path, "--overwrite")
    (tmp_path / "run" / "nodes" / "node0").mkdir(parents=True)
    (tmp_path / "run" / "slurm-job").mkdir()
    assert prepare_output_dir(config) == []  # nothing of a run there: a fresh run, and those stay


def test_metrics_tail_skips_older_records_and_follows_a_replaced_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 9, "source": "trainer", "time": 100.0, "perf/step_time_s": 1.0}) + "\n")
    tail = MetricsTail(path, since=200.0)
    tail.poll()
    assert tail.last("trainer", "perf/step_time_s") is None  # an earlier run's last step is not this run's
    path.rename(tmp_path / "old.jsonl")  # --overwrite elsewhere: the file goes, a new one comes
    path.write_text(json.dumps({"step": 0, "source": "trainer", "time": 300.0, "perf/step_time_s": 2.0}) + "\n")
    tail.poll()
    assert tail.last("trainer", "perf/step_time_s") == (0, 2.0)


def test_a_split_node_checks_only_the_gpus_of_what_it_starts(tmp_path, monkeypatch):
    from prime_rl.launch.plan import assign_devices

    monkeypatch.setenv("PRIME_INFERENCE__API_KEY", "k" * 32)
    server_node = rl_config(tmp_path, "--deployment.components", '["inference"]', "--inference.port", "8000",
                            "--deployment.trainer-gpu-ids", "[7]")
    assert assign_devices(server_node) == ("", "")  # no GPU here; the trainer's ids belong to another node
    with pytest.raises(ConfigError, match="no CUDA device"):
        assign_devices(rl_config(tmp_path, "--deployment.inference-gpu-ids", "[0]"))


def test_a_teacher_that_does_not_exist_yet_stops_rl_at_config_time_naming_the_command(tmp_path, monkeypatch):
    """examples/reverse_text/rl_opd.toml before its teacher run: one line naming rl_teacher.toml, exit 2, no
    output directory, no process started."""
    from tests.support import REPO
    from tests.support.entrypoints import run_entrypoint

    monkeypatch.chdir(REPO)
    out = tmp_path / "run"
    done = run_entrypoint("rl", "@", "examples/reverse_text/rl_opd.toml", "--output-dir", str(out),
                          "--teacher.model.name", "outputs/reverse_text_teacher/weights/step_999999")
    assert done.returncode == 2
    assert "teacher.model.name" in done.stderr and "uv run rl @ examples/reverse_text/rl_teacher.toml" in done.stderr
    assert not out.exists()


def test_the_plot_has_a_panel_per_metric_with_n_a_for_absent_ones_and_turn_panels_for_multi_turn_runs(tmp_path,
                                                                                                        monkeypatch):
    import matplotlib.axes

    from prime_rl import run_report as report

    texts, panels = [], []
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, *a, **k: texts.append(a[2]))
    original = matplotlib.axes.Axes.set_ylabel
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylabel",
                        lambda self, label, **k: (panels.append(label), original(self, label, **k)))
    path = tmp_path / "metrics.jsonl"
    with open(path, "w") as f:
        for step in range(3):  # a custom loss: no soft gate; a multi-turn environment
            f.write(json.dumps({"step": step, "source": "orchestrator", "reward/mean": 0.1 * step,
                                "rollout/turns_mean": 2.5, "rollout/tool_calls_mean": 1.0}) + "\n")
            f.write(json.dumps({"step": step, "source": "trainer", "loss/total": 0.1, "loss/mismatch_kl": 0.0}) + "\n")
    tail = MetricsTail(path)
    tail.poll()
    assert report.write_plot(tail, tmp_path / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    assert panels == [title for _, _, title in report.PLOTTED + report.MULTI_TURN_PLOTTED]
    assert texts.count("n/a") == 6  # entropy, grad norm, importance ratio, soft gate, completion tokens, lag


def test_run_again_resumes_latest_after_a_back_off_and_refuses_what_a_restart_cannot_mend(tmp_path, monkeypatch,
                                                                                           capsys):
    """A trainer or orchestrator that died runs the whole run again from the newest complete checkpoint (resume
    'latest', never --overwrite), up to max_restarts within the window; a server (restarted alone), a user error
    (exit 2), a full disk (not retryable) or a run with no complete checkpoint stop it, the last in one first line."""
    from prime_rl.configs.base import with_values
    from prime_rl.launch import rl as rl_module
    from prime_rl.launch.rl import ComponentFailed, run_again

    monkeypatch.setattr(rl_module, "BACKOFF_S", 0.001)
    config = rl_config(tmp_path, "--overwrite", "--deployment.max-restarts", "2")
    died = ComponentFailed("trainer exited with code -9; last lines of x:\n  boom", "trainer", "exited with code -9",
                           retryable=True)
    with pytest.raises(ComponentFailed) as refused:  # nothing to resume from yet
        run_again(config, died, {})
    assert str(refused.value) == ("trainer exited with code -9, not run again (no complete checkpoint to run again "
                                  "from); last lines of x:\n  boom")
    for part in ("trainer", "orchestrator"):
        (tmp_path / "run" / "checkpoints" / "step_4" / part).mkdir(parents=True)
    deaths: dict = {}
    again = run_again(config, died, deaths)
    assert again.ckpt.resume_step == "latest" and not again.overwrite and config.overwrite  # the original untouched
    assert "trainer exited with code -9; running the run again from checkpoint step 4" in capsys.readouterr().err
    run_again(again, died, deaths)
    with pytest.raises(ComponentFailed, match=r"not run again \(2 restart\(s\) within 3600s \(deployment.max_restarts"):
        run_again(again, died, deaths)
    split = with_values(config, {"deployment.components": ["orchestrator", "inference"]})  # the trainer elsewhere
    for refused, where in ((ComponentFailed("inference exited", "inference", "exited", retryable=True), config),
                           (ComponentFailed("trainer exited with code 2", "trainer", "exited with code 2"), config),
                           (died, split)):
        with pytest.raises(ComponentFailed) as raised:
            run_again(where, refused, {})
        assert raised.value is refused
    monkeypatch.setattr(rl_module.time, "monotonic", lambda: 1e9)  # the window has passed: counted afresh
    assert run_again(again, died, deaths).ckpt.resume_step == "latest"

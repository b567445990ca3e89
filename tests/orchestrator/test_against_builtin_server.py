"""The orchestrator against the builtin inference server, with the test playing the trainer.

The fake trainer checks batch k and writes `weights/step_{k+1}` (a copy of the model) only
once the orchestrator has written batch k + max_async_level (as far ahead as it may go)
and TRAIN_S more seconds passed: a trainer that is always the bottleneck, so every step
n must run at exactly lag min(n, max_async_level), whatever the machine's speed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from prime_rl.batch_format import read_rank
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.orchestrator import body
from prime_rl.run_dir import rollout_dir
from prime_rl.utils.fs import atomic_dir, wait_for_path
from tests.support.inference_server import SRC, start_server, stop_server

pytestmark = pytest.mark.slow

SEQ_LEN = 256
STEPS = 3
TRAIN_S = 0.5  # the fake trainer's step time


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    # Every test's run directory (and so its weights/) lies under the session's base temp directory.
    proc, url = start_server(tiny_model_dir, tmp_path_factory.mktemp("server") / "inference.log", "builtin", 0, 120,
                             "--weight-dirs", json.dumps([str(tmp_path_factory.getbasetemp())]), seq_len=SEQ_LEN)
    yield url
    stop_server(proc)


def make_config(output_dir: Path, model_dir: Path, url: str, max_async_level: int, **extra) -> OrchestratorConfig:
    # Eval only where its metrics are checked (max_async_level 1): generation is the slow part.
    evaluation = {"interval": 2, "num_examples": 2, "rollouts": 2} if max_async_level == 1 else {"interval": None}
    overrides = {
        "output_dir": str(output_dir),
        "model": {"name": str(model_dir)},
        "client": {"base_url": f"{url}/v1", "connect_timeout_s": 10},
        "max_steps": STEPS,
        "seq_len": SEQ_LEN,
        "max_async_level": max_async_level,
        "batch_size": 8,
        "rollouts_per_example": 4,
        "trainer_world_size": 2,
        "sampling": {"max_tokens": 12},
        "weights_timeout_s": 20,
        "wandb": {"mode": "disabled"},
        "eval": evaluation,
        "ckpt": {"interval": 1},
    } | extra
    return OrchestratorConfig.build(overrides=overrides)


def check_batch(output_dir: Path, step: int, config: OrchestratorConfig) -> list[int]:
    """The contract's fields with consistent shapes; returns the policy step of every sample."""
    ranks = [read_rank(output_dir, step, r) for r in range(config.trainer_world_size)]
    assert len({len(b.micro_batches) for b in ranks}) == 1
    policy_steps = []
    for batch in ranks:
        assert (batch.step, batch.temperature, batch.max_tokens) == (step, 1.0, 12)
        for mb in batch.micro_batches:
            mb.validate()
            assert mb.num_tokens <= SEQ_LEN
            assert not mb.loss_mask[torch.cumsum(mb.sample_lens, 0) - mb.sample_lens].any()  # first tokens never train
            assert (mb.inference_logprobs[mb.loss_mask] <= 0).all()
            assert (mb.inference_logprobs[~mb.loss_mask] == 0).all() and (mb.advantages[~mb.loss_mask] == 0).all()
            policy_steps += mb.policy_step[mb.trained_samples].tolist()  # shared prompts' roots train nothing
    assert len(policy_steps) == config.batch_size
    return policy_steps


def play_trainer(output_dir: Path, model_dir: Path, config: OrchestratorConfig, errors: list) -> dict:
    """Read each step's batch, 'train' for TRAIN_S, write the next weights. Returns policy steps per step."""
    seen = {}
    try:
        for step in range(STEPS):
            ahead = min(step + config.max_async_level, STEPS - 1)
            wait_for_path(rollout_dir(output_dir, ahead), 60, f"rollouts step {ahead}")
            seen[step] = check_batch(output_dir, step, config)
            time.sleep(TRAIN_S)
            with atomic_dir(output_dir / "weights" / f"step_{step + 1}") as tmp:
                shutil.copytree(model_dir, tmp, dirs_exist_ok=True)
                os.utime(tmp)  # copytree copied the model dir's old mtime; a trainer's save is fresh
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)
    return seen


def run_with_fake_trainer(config: OrchestratorConfig, model_dir: Path) -> dict:
    errors: list = []
    seen: dict = {}
    trainer = threading.Thread(target=lambda: seen.update(play_trainer(config.output_dir, model_dir, config, errors)))
    trainer.start()
    try:
        body(config)
    finally:
        trainer.join(timeout=90)
    assert not errors, errors
    return seen


def metrics(output_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("source", "orchestrator") == "orchestrator"]


@pytest.mark.parametrize("max_async_level", [0, 1, 2])
def test_async_levels_are_respected(server, tiny_model_dir, tmp_path, max_async_level):
    config = make_config(tmp_path / "run", tiny_model_dir, server, max_async_level)
    seen = run_with_fake_trainer(config, tiny_model_dir)
    for step, policy_steps in seen.items():
        assert all(0 <= step - p <= max_async_level for p in policy_steps), (step, policy_steps)
    # The trainer is the bottleneck, so the orchestrator runs exactly as far ahead as allowed.
    assert {step: set(ps) for step, ps in seen.items()} == {
        step: {step - min(step, max_async_level)} for step in range(STEPS)
    }
    rows = metrics(config.output_dir)
    by_step = {row["step"]: row for row in rows}
    assert sorted(by_step) == list(range(STEPS))
    for key in ("reward/mean", "reward/std", "reward/min", "reward/max", "reward/reverse-text/mean",
                "reward/reverse-text/lcs_ratio", "advantage/mean", "advantage/std", "seq_len/prompt_mean",
                "seq_len/completion_mean", "seq_len/completion_max", "rollout/truncated_frac",
                "rollout/filtered_frac", "async/policy_lag_mean", "async/policy_lag_max",
                "perf/inference_tokens_per_s", "perf/step_time_s", "perf/wait_for_weights_s"):
        assert all(key in row for row in by_step.values()), key
    if max_async_level == 1:
        assert "eval/reverse-text/reward" in by_step[0] and "eval/reverse-text/pass@k" in by_step[2]
        assert "eval/reverse-text/reward" not in by_step[1]
    assert [by_step[s]["async/policy_lag_max"] for s in range(STEPS)] == [
        max(s - p for p in seen[s]) for s in range(STEPS)
    ]
    if max_async_level == 0:  # on-policy: every step after the first waited for the slow trainer
        assert all(by_step[s]["perf/wait_for_weights_s"] > 0.5 * TRAIN_S for s in range(1, STEPS))
    state_file = config.output_dir / "checkpoints" / f"step_{STEPS}" / "orchestrator" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["step"] == STEPS and state["env_cursors"] == {"reverse-text": STEPS * 2}
    assert (config.output_dir / "logs" / "orchestrator.log").read_text().count("reward") >= STEPS


def prompts(output_dir: Path, step: int) -> list[list[int]]:
    """The prompt tokens of every sample of a step (the tokens before its first trained one)."""
    found = []
    for batch in (read_rank(output_dir, step, r) for r in range(2)):
        for mb in batch.micro_batches:
            lens = mb.sample_lens.tolist()
            for ids, mask in zip(mb.input_ids.split(lens), mb.loss_mask.split(lens), strict=True):
                if mask.any():
                    found.append(ids[: int(mask.float().argmax())].tolist())
    return sorted(found)


def test_resume_continues_from_the_checkpoint(server, tiny_model_dir, tmp_path):
    config = make_config(tmp_path / "run", tiny_model_dir, server, 2)
    run_with_fake_trainer(config, tiny_model_dir)
    before = prompts(config.output_dir, STEPS - 1)
    first_write = rollout_dir(config.output_dir, STEPS - 1).stat().st_mtime_ns
    # Resume from the checkpoint before the end: the stale last batch is dropped and regenerated.
    resumed = make_config(config.output_dir, tiny_model_dir, server, 2, ckpt={"resume_step": STEPS - 1})
    body(resumed)  # the weights it needs already exist: no trainer needed
    rows = metrics(config.output_dir)
    assert [row["step"] for row in rows] == list(range(STEPS))  # the re-run step's old line was replaced
    assert rows[-1]["time"] > rows[-2]["time"]
    assert rollout_dir(config.output_dir, STEPS - 1).stat().st_mtime_ns > first_write
    # Same data cursor and RNG: the regenerated step has the first run's prompts.
    assert prompts(config.output_dir, STEPS - 1) == before and len(before) == 8
    state_file = config.output_dir / "checkpoints" / f"step_{STEPS}" / "orchestrator" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["env_cursors"] == {"reverse-text": STEPS * 2}


def test_unreachable_server_is_a_clear_error_within_the_timeout(tiny_model_dir, tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "prime_rl.orchestrator.orchestrator", "--output-dir", str(tmp_path / "run"),
         "--model.name", str(tiny_model_dir), "--client.base-url", "http://127.0.0.1:9/v1",
         "--client.connect-timeout-s", "2", "--wandb.mode", "disabled"],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(SRC), "PATH": ""},
    )
    assert proc.returncode == 1
    assert "inference server at http://127.0.0.1:9 unreachable for 2s" in proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
    assert not (tmp_path / "run" / "rollouts").exists()


def test_server_dying_mid_run_is_a_clear_error_and_leaves_no_partial_batch(tiny_model_dir, tmp_path):
    proc, url = start_server(tiny_model_dir, tmp_path / "inference.log", "builtin", 0, 120, seq_len=SEQ_LEN)
    config = make_config(tmp_path / "run", tiny_model_dir, url, 50, max_steps=50, client={
        "base_url": f"{url}/v1", "connect_timeout_s": 2})
    errors: list = []

    def run():
        try:
            body(config)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_for_path(rollout_dir(config.output_dir, 0), 60, "the first batch")
    finally:
        stop_server(proc)
    start = time.monotonic()
    thread.join(timeout=60)
    assert not thread.is_alive() and time.monotonic() - start < 20
    assert len(errors) == 1 and f"inference server at {url} unreachable for 2s" in str(errors[0])
    rollouts = config.output_dir / "rollouts"
    assert all(p.name.startswith("step_") for p in rollouts.iterdir())  # no temporary leftovers
    assert all((p / "rank_1.pt").exists() for p in rollouts.iterdir())


@pytest.mark.parametrize("max_async_level", [0, 1])
def test_continuous_rollouts_respect_the_lag_per_token_against_a_real_server(server, tiny_model_dir, tmp_path,
                                                                             max_async_level):
    """rollout_mode = continuous: requests cross step boundaries and weights load in flight; still every
    trained sample's oldest token (its policy_step) is within max_async_level of its step."""
    config = make_config(tmp_path / "run", tiny_model_dir, server, max_async_level, rollout_mode="continuous")
    seen = run_with_fake_trainer(config, tiny_model_dir)
    assert sorted(seen) == list(range(STEPS))
    for step, policy_steps in seen.items():
        assert all(0 <= step - p <= max_async_level for p in policy_steps), (step, policy_steps)
    by_step = {row["step"]: row for row in metrics(config.output_dir)}
    for step in range(STEPS):
        row = by_step[step]
        assert row["async/token_lag_max"] <= max_async_level and row["async/policy_lag_max"] <= max_async_level
        assert 0 <= row["async/inference_idle_frac"] <= 1 and row["async/stale_groups"] >= 0

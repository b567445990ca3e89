"""`sft @ examples/reasoning_gym/sft.toml`, then `rl @ examples/reasoning_gym/rl.toml` shortened to 21 steps, both
in-process from the repository root with the example's own settings: the greedy exact-answer rate on held-out words
rises by at least +0.10 from the SFT model's (measured: 0.414 -> 0.641 at step 20; the full run and its figures are in
examples/reasoning_gym/README.md)."""

from __future__ import annotations

import pytest

from tests.support import REPO
from tests.support.entrypoints import run_entrypoint
from tests.support.rl_in_process import run_in_process

pytestmark = [pytest.mark.slow]
pytest.importorskip("reasoning_gym", reason="the reasoning-gym extra is not installed")

PASS_RATE = "eval/reasoning-gym/pass@k"


def test_the_reasoning_gym_example_learns_exact_answers_after_its_sft_warm_up(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    sft = run_entrypoint("sft", "@", "examples/reasoning_gym/sft.toml", "--output-dir", str(tmp_path / "sft"),
                         "--wandb.mode", "disabled")
    assert sft.returncode == 0, sft.stderr[-3000:]
    run = run_in_process(["@", "examples/reasoning_gym/rl.toml", "--model.name", str(tmp_path / "sft/weights/step_150"),
                          "--output-dir", str(tmp_path / "rl"), "--max-steps", "21", "--wandb.mode", "disabled"])
    evals = {step: row[PASS_RATE] for step, row in run.rows("orchestrator").items() if PASS_RATE in row}
    assert sorted(evals) == [0, 10, 20]
    assert evals[20] >= evals[0] + 0.10, evals
    assert all(row["reward/reasoning-gym/spell_backward"] == row["reward/mean"]  # all or nothing: pass_score = 1
               for row in run.rows("orchestrator").values())

"""`rl` with `[orchestrator.curriculum]` over a data set: the section reaches the orchestrator through `rl`, every
step logs the curriculum's metrics, its state is in the orchestrator's checkpoint, and a resumed run (its recorded
config, `--ckpt.resume-step latest`) continues from it on policy."""

from __future__ import annotations

import json
import random

import pytest

from prime_rl.run_dir import ORCHESTRATOR, ORCHESTRATOR_STATE, checkpoint_dir
from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]


def data_set(path) -> str:
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefgh", k=rng.randint(3, 6))) for _ in range(12)]
    path.write_text("".join(json.dumps({"prompt": w, "answer": w[::-1]}) + "\n" for w in words))
    return str(path)


def groups_in_windows(state: dict) -> int:
    return sum(map(len, state["curriculum"]["envs"]["dataset"]["history"].values()))


def test_rl_with_a_curriculum_logs_it_checkpoints_it_and_resumes_from_it(tmp_path):
    table = (f'[[orchestrator.env]]\nid = "dataset"\nargs = {{ path = "{data_set(tmp_path / "d.jsonl")}", '
             'extract = "none", rewards = { lcs_ratio = 1.0 } }\n'
             "[orchestrator.curriculum]\nwindow = 2\npass_threshold = 0.5\n")
    run = on_policy_run(tmp_path, table, seq_len=256, max_tokens=8)
    rows = run.rows("orchestrator")
    assert all(row["curriculum/pool_size"] == 12 for row in rows.values())
    assert rows[2]["curriculum/unseen_frac"] < 1
    state = json.loads((checkpoint_dir(run.run_dir, 3, ORCHESTRATOR) / ORCHESTRATOR_STATE).read_text())
    assert 0 < groups_in_windows(state) <= 3 * 4  # 3 steps of 4 groups

    resumed = on_policy_run(tmp_path, table, seq_len=256, max_tokens=8, max_steps=5, resume=True)
    assert set(resumed.rows("orchestrator")) == set(range(5))
    later = json.loads((checkpoint_dir(run.run_dir, 5, ORCHESTRATOR) / ORCHESTRATOR_STATE).read_text())
    assert groups_in_windows(later) > groups_in_windows(state)  # carried over and grew (at most 2 x 12 fit)

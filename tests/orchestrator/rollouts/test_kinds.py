"""The rollout seam: every draw goes to the runner of its environment's rollout kind; a kind of one's own is one
module and one registration line (`tests/support/hinted_kind.py`), and an unknown kind is one line naming the
known ones."""

from __future__ import annotations

import pytest

from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.rollouts.kinds import RUNNERS, build_runners
from prime_rl.orchestrator.rollouts.seam import RunnerContext
from prime_rl.utils.errors import UserError


def test_a_kind_without_a_runner_is_one_line_naming_the_known_kinds(tmp_path):
    context = RunnerContext(OrchestratorConfig.build(overrides={"output_dir": str(tmp_path)}), client=None)
    with pytest.raises(UserError) as error:
        build_runners(["single_turn", "hinted-typo"], context)
    assert str(error.value).count("\n") == 0 and "'hinted-typo'" in str(error.value)
    assert all(kind in str(error.value) for kind in ("single_turn", "multi_turn", "agent"))
    assert set(build_runners(["single_turn", "single_turn"], context)) == {"single_turn"}  # one runner a kind
    assert "chat_tokens" not in context.__dict__  # a single-turn run loads no chat template


@pytest.mark.slow
def test_a_kind_of_ones_own_trains_end_to_end(tmp_path, monkeypatch):
    from tests.support import REPO, hinted_kind
    from tests.support.rl_in_process import run_in_process

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(hinted_kind, "GROUPS", [])
    run = run_in_process(["--output-dir", str(tmp_path / "run"), "--model.name", "tiny-reverse-text",
                          "--max-steps", "2", "--seq-len", "256", "--orchestrator.batch-size", "8",
                          "--orchestrator.rollouts-per-example", "4", "--orchestrator.sampling.max-tokens", "8",
                          "--wandb.mode", "disabled",
                          "--orchestrator.env", '[{id = "tests.support.hinted_kind:HintedReverseText"}]'])
    assert "hinted" in RUNNERS
    assert hinted_kind.GROUPS == [4] * 4  # 2 steps of 2 groups of 4, every one through the kind's runner
    assert sorted(run.rows("trainer")) == [0, 1]
    assert all("reward/hinted-reverse-text/mean" in row for row in run.rows("orchestrator").values())

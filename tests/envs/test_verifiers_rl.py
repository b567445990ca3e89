"""A verifiers 0.4 tool taskset (`tests/support/tasksets/verifiers_calculator.py`, loaded by its verifiers id)
trains 3 steps through `rl`, token-exact: max_async_level 0, fp32, builtin backend, mismatch KL < 1e-6 at every
step, with the embedded `tiny-calculator` model, which calls the taskset's `multiply` tool, so the conversations
are multi-turn and their tool and template tokens are masked. Skipped only when the 'verifiers' extra is not
installed."""

from __future__ import annotations

import pytest

from tests.support import TASKSETS
from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]
pytest.importorskip("verifiers.v1", reason="the 'verifiers' extra is not installed")


def test_a_verifiers_tool_taskset_trains_exactly_the_sampled_tokens(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TASKSETS))  # verifiers imports the taskset by its id
    run = on_policy_run(
        tmp_path, '[[orchestrator.env]]\nid = "verifiers_calculator"\nargs = { max_turns = 3 }\n',
        seq_len=512, max_tokens=96, model="tiny-calculator")
    orchestrator = run.rows("orchestrator")
    for step, row in orchestrator.items():  # scored by the taskset's own reward; the tool was called
        assert row["rollout/env_error_frac"] == 0 and "reward/verifiers_calculator/exact" in row, (step, row)
        assert row["rollout/tool_calls_mean"] > 0.5 and row["rollout/turns_mean"] > 1.5, (step, row)
        assert row["rollout/sampled_token_frac"] < 1, (step, row)  # tool and template tokens, not trained

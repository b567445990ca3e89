"""A verifiers 0.4 tool taskset (`tests/verifiers_envs.py`, loaded by its verifiers id) trains through `rl`,
token-exact: max_async_level 0, fp32, builtin backend, mismatch KL < 1e-6 at every step. Skipped only when the
'verifiers' extra is not installed. The embedded model does not call the tool, so these rollouts are one turn: the
tool turns themselves are covered by tests/unit/test_envs_verifiers.py and run through the same runner as
test_rl_learns.py's multi-turn tool run."""

from __future__ import annotations

import pytest

from rl_runs import on_policy_run_with_test_env  # tests/ is on sys.path (rootdir conftest)

pytestmark = [pytest.mark.slow]
pytest.importorskip("verifiers.v1", reason="the 'verifiers' extra is not installed")


def test_a_verifiers_tool_taskset_trains_exactly_the_sampled_tokens(tmp_path):
    _, orchestrator = on_policy_run_with_test_env(
        tmp_path, '[[orchestrator.env]]\nid = "verifiers_envs"\nargs = { max_turns = 3 }\n', seq_len=512, max_tokens=64)
    for row in orchestrator.values():  # every rollout ran and was scored by the taskset's own reward and metric
        assert row["rollout/env_error_frac"] == 0 and "reward/verifiers_envs/letters" in row
        assert "reward/verifiers_envs/calls" in row

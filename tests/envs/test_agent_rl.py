"""Agents that own their loop, trained on policy (in-process `rl`, max_async_level 0, fp32, builtin backend): the
example's Agents SDK agent and plain `openai` loop on the calculator task. The trainer's logprobs equal the
server's at every step (mismatch KL < 1e-6), which holds only if every trained token sits where it was sampled;
a resumed run logs every step once."""

from __future__ import annotations

import json

import pytest

from prime_rl.run_dir import rollout_dir, samples_file, token_outcomes_file
from tests.support.rl_in_process import on_policy_run
from tests.support.rl_runs import logged_steps

pytestmark = [pytest.mark.slow]


def agent_env(agent: str) -> str:
    return ('[[orchestrator.env]]\nid = "agent"\n'
            f'args = {{ function = "examples/agent/{agent}.py:run", task = {{ id = "calculator" }} }}\n')


@pytest.mark.parametrize("agent", ["agents_sdk", "openai_loop"])
def test_an_agent_trains_exactly_the_tokens_it_sampled_and_resumes(tmp_path, agent):
    run = on_policy_run(tmp_path, agent_env(agent), seq_len=512, max_tokens=96, model="tiny-calculator",
                        max_steps=2)
    for step, row in run.rows("orchestrator").items():
        assert row["rollout/env_error_frac"] == 0 and row["rollout/segments_mean"] == 1, (step, row)
        assert row["rollout/tool_calls_mean"] > 0.25 and row["rollout/turns_mean"] > 1.25, (step, row)
        assert row["rollout/sampled_token_frac"] < 1 and "reward/agent/exact_match" in row, (step, row)
    samples = [json.loads(line) for line in samples_file(rollout_dir(run.run_dir, 1)).read_text().splitlines()]
    assert len(samples) == 16 and {s["env"] for s in samples} == {"agent"}  # what each session recorded
    assert any(m["role"] == "tool" for s in samples for m in s["messages"])
    if agent == "openai_loop":
        resumed = on_policy_run(tmp_path, "", seq_len=512, max_tokens=96, max_steps=3, resume=True)
        for source in ("orchestrator", "trainer"):
            assert logged_steps(resumed.run_dir, source) == [0, 1, 2], source
        for step in range(3):  # every step's samples once: the resumed run wrote the steps it regenerated
            written = samples_file(rollout_dir(resumed.run_dir, step)).read_text().splitlines()
            assert len(written) == 16 and {json.loads(line)["step"] for line in written} == {step}
            check_token_outcomes(resumed.run_dir, step)


def check_token_outcomes(run_dir, step: int) -> None:
    """The trainer recorded every written sample of the step once, under its key: on policy, its logprob of each
    sampled token is the server's (within 5e-5: both are written to 5 decimals, and fp32 forwards of a different
    batch shape differ by ~1e-5; a token out of place differs by far more) and each token's outcome is "k", and the
    environment's tokens between turns are "-"."""
    tokens = {t["key"]: t for line in samples_file(rollout_dir(run_dir, step)).read_text().splitlines()
              for t in json.loads(line)["tokens"]}
    records = [json.loads(line) for line in token_outcomes_file(rollout_dir(run_dir, step), 0).read_text().splitlines()]
    assert sorted(r["key"] for r in records) == sorted(tokens)
    for record in records:
        sampled = tokens[record["key"]]
        assert record["outcomes"] == "".join("k" if s else "-" for s in sampled["sampled"])
        for lq, lp, s in zip(sampled["logprobs"], record["logprobs"], sampled["sampled"], strict=True):
            assert not s or abs(lp - lq) <= 5e-5, (lq, lp)

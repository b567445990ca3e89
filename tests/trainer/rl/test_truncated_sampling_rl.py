"""Importance ratios under top-p / top-k / min-p: an on-policy run (in-process, max_async_level 0, fp32,
builtin backend) has trainer logprobs equal to the server's at every step when the trainer scores tokens under
the sampler's truncation, and visibly not when it uses the full softmax (`trainer.match_truncation = false`)."""

from __future__ import annotations

import pytest

from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]

TRUNCATIONS = {"top_p": ["--orchestrator.sampling.top-p", "0.9"],
               "top_k": ["--orchestrator.sampling.top-k", "20"],
               "min_p": ["--orchestrator.sampling.min-p", "0.05"]}


def truncated_run(tmp_path, extra: list[str], exact: bool) -> dict[int, dict]:
    return on_policy_run(tmp_path, "", seq_len=256, max_tokens=32, extra=extra, exact=exact).rows("trainer")


@pytest.mark.parametrize("truncation", list(TRUNCATIONS))
def test_on_policy_ratio_is_exact_under_truncated_sampling(tmp_path, truncation):
    trainer = truncated_run(tmp_path, TRUNCATIONS[truncation], exact=True)  # asserts mismatch KL < 1e-6 every step
    assert all(abs(row["loss/importance_ratio"] - 1) < 1e-5 for row in trainer.values()), trainer


def test_without_the_correction_the_same_run_shows_the_error(tmp_path):
    trainer = truncated_run(tmp_path, [*TRUNCATIONS["top_p"], "--trainer.match-truncation", "false"], exact=False)
    # The full softmax spreads mass the sampler never drew from: log r = log(kept mass) < 0 on every token.
    for step, row in trainer.items():
        assert row["loss/mismatch_kl"] > 1e-4 and row["loss/importance_ratio"] < 0.999, (step, row)

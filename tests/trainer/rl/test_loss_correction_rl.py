"""`[loss.correction] old_logprobs = "trainer"` in a real (in-process) run: on policy (max_async_level 0, fp32,
builtin server) the trainer's recomputed pi_old equals the sampler's logprobs, and over 3 update epochs the
surrogate's ratio moves while the behaviour weight, taken once before the first update, stays at 1."""

from __future__ import annotations

import pytest

from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]

DECOUPLED = """
[loss]
type = "dapo"
[loss.correction]
preset = "decoupled_token_is"
[trainer]
update_epochs = 3
[trainer.optim]
lr = 1e-2
"""


def test_decoupled_correction_on_policy_recomputes_the_sampler_and_moves_only_the_surrogate(tmp_path):
    run = on_policy_run(tmp_path, DECOUPLED, seq_len=256, max_tokens=8, exact=False)
    for step, row in run.rows("trainer").items():
        # lo = lq: the behaviour policy is the sampler, within fp32 rounding of different batch shapes.
        assert abs(row["correction/kl"]) < 1e-6, (step, row["correction/kl"])
        assert row["correction/k3_kl"] < 1e-9, step
        assert abs(row["correction/is_weight"] - 1) < 1e-6, step
        assert row["correction/is_weight_truncated_frac"] == 0, step
        # The metrics are the third pass's: two updates moved pi_theta away from pi_old.
        assert row["loss/mismatch_kl"] > 1e-6, (step, row["loss/mismatch_kl"])

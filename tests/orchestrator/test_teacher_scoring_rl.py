"""`rl` with a teacher: rl starts the teacher's server, the orchestrator puts its logprobs in every batch, and the
trainer logs `loss/teacher_kl`. The teacher is the policy's own model, on-policy (max_async_level 0, fp32, builtin),
at a temperature other than 1, on a multi-turn environment: at step 0 the teacher's logprob of every trained token
must equal the sampler's (so the temperature is the batch's and no environment token is scored as the policy's),
and the KL must be 0."""

from __future__ import annotations

import pytest
import torch

from tests.support.rl_in_process import on_policy_run

pytestmark = [pytest.mark.slow]

MULTI_TURN = '[[orchestrator.env]]\nid = "reverse-text-hint"\n'


def test_rl_with_a_teacher_scores_every_trained_token_at_the_batch_temperature(tmp_path):
    teacher = ["--teacher.model.name", "tiny-reverse-text", "--teacher.backend", "builtin",
               "--orchestrator.sampling.temperature", "0.8"]
    run = on_policy_run(tmp_path, MULTI_TURN, seq_len=256, max_tokens=16, extra=teacher)
    trainer, orchestrator = run.rows("trainer"), run.rows("orchestrator")
    assert "teacher" in run.served_steps  # rl started the teacher's server
    assert abs(trainer[0]["loss/teacher_kl"]) < 1e-5, trainer[0]
    assert all("loss/teacher_kl" in row for row in trainer.values())
    assert all(row["rollout/teacher_skipped_frac"] == 0 and row["perf/teacher_s"] > 0 for row in orchestrator.values())
    assert (run.run_dir / "configs" / "teacher.toml").is_file()
    batch = torch.load(run.run_dir / "rollouts" / "step_0" / "rank_0.pt", weights_only=True)
    assert batch["temperature"] == pytest.approx(0.8)
    env_tokens = 0
    for mb in batch["micro_batches"]:
        mask, teacher_lp, sampler_lp = mb["loss_mask"], mb["teacher_logprobs"], mb["inference_logprobs"]
        assert torch.allclose(teacher_lp[mask], sampler_lp[mask], atol=1e-5) and (teacher_lp[~mask] == 0).all()
        env_tokens += int((~mask).sum())
    assert env_tokens > 0 and orchestrator[0]["rollout/turns_mean"] > 1  # some rollouts had an environment turn

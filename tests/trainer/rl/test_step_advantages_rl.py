"""Token-level advantage types end to end: `rl` with PPO's GAE over a critic (separate, or a value head) and with
token-level REINFORCE++ (KL to the reference in the reward) trains on-policy (max_async_level 0, fp32, builtin) on
advantages the trainer computed, and logs the critic's and the KL's metrics."""

from __future__ import annotations

import math

import pytest

from prime_rl.batch_format import read_rank
from tests.support.rl_in_process import on_policy_run
from tests.support.rl_runs import on_policy_rl_process

pytestmark = [pytest.mark.slow]

GAE = '[orchestrator.advantage]\ntype = "gae"\ngamma = 0.99\nlam = 0.9\n[trainer.critic.optim]\nlr = 1e-3\n'
RPP = ('[orchestrator.advantage]\ntype = "reinforce_plus_plus"\n'
       '[orchestrator.advantage.reward_kl]\nestimator = "k3"\ncoef = 0.05\n')


@pytest.mark.parametrize("critic", ["separate", "value_head"])
def test_gae_with_a_critic_runs_on_policy_and_logs_the_value_metrics(tmp_path, critic):
    """Either kind of critic (`--trainer.critic.type`); a value head's hidden-state hook leaves the policy's forward
    as it was: its logprobs still equal the server's (mismatch KL < 1e-6, checked by the run helper)."""
    run = on_policy_run(tmp_path, GAE, seq_len=256, max_tokens=8, extra=["--trainer.critic.type", critic])
    trainer, orchestrator = run.rows("trainer"), run.rows("orchestrator")
    for step, row in trainer.items():
        for key in ("value/loss", "value/mean", "value/explained_variance", "value/grad_norm", "optim/grad_norm"):
            assert math.isfinite(row[key]), (step, key, row)
        assert row["value/loss"] > 0 and row["optim/grad_norm"] > 0, (step, row)
    # The orchestrator left the advantages to the trainer: its advantage metrics are all zero.
    assert all(row["advantage/std"] == 0 for row in orchestrator.values())
    # The critic trains: its values of the next step's batch come from updated weights.
    assert len({round(trainer[s]["value/mean"], 9) for s in range(3)}) == 3, trainer


def test_token_level_reinforce_plus_plus_folds_the_reference_kl_into_the_reward(tmp_path):
    run = on_policy_run(tmp_path, RPP, seq_len=256, max_tokens=8)
    trainer = run.rows("trainer")
    assert trainer[0]["advantage/kl_in_reward"] == pytest.approx(0.0, abs=1e-6)  # step 0: the policy is the ref
    assert trainer[2]["advantage/kl_in_reward"] > 0  # later steps have moved away from it (k3 >= 0)
    assert all("value/loss" not in row and row["optim/grad_norm"] > 0 for row in trainer.values())


GROUP_KL = ('[orchestrator]\nshare_prompts = false\n[orchestrator.advantage]\ntype = "grpo"\n'
            '[orchestrator.advantage.reward_kl]\nestimator = "k3"\ncoef = 0.05\n[trainer]\nnum_processes = 2\n')


def test_grpo_with_the_kl_in_the_reward_gathers_groups_split_over_two_ranks(tmp_path):
    """Without shared prompts a group's samples spread over both trainer ranks; the trainer recomputes the
    group advantages from rewards minus the KL on every rank alike and trains on them, on-policy."""
    trainer, orchestrator = on_policy_rl_process(tmp_path, GROUP_KL, seq_len=256, max_tokens=8)
    on_rank = [{g for mb in read_rank(tmp_path / "run", 0, rank).micro_batches for g in mb.sample_groups.tolist()
                if g >= 0} for rank in (0, 1)]
    assert on_rank[0] & on_rank[1], on_rank  # some group has samples on both ranks: the gather is exercised
    assert trainer[0]["advantage/kl_in_reward"] == pytest.approx(0.0, abs=1e-6)  # step 0: the policy is the ref
    assert trainer[2]["advantage/kl_in_reward"] > 0
    assert all(row["optim/grad_norm"] > 0 for row in trainer.values())
    assert all(row["advantage/std"] > 0 for row in orchestrator.values())  # the orchestrator's own (task) ones

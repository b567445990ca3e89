"""Advantages: how rewards become the per-token A the policy loss trains on. The one implementation of the math,
imported by the orchestrator and the trainer alike; it imports neither (nor any other component:
`tests/test_structure.py`). The formulas: docs/orchestrator.md#advantages (the types computed in the orchestrator),
docs/losses.md#token-level-advantages (those computed in the trainer, the KL in the reward),
docs/losses.md#on-policy-distillation (the OPD advantage).

    group.py    the types computed in the orchestrator, fn(rewards [groups, rollouts]) -> advantages
                (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline, custom); `whiten_samples`
                (`normalize_advantages`); equal and zero-advantage groups; `compute_advantages`
    token.py    the types computed in the trainer, fn(row: TokenRow) -> A [T] (gae, reinforce_plus_plus);
                the GAE recursion; `whiten_tokens` over the step's trained tokens
    kl.py       KL in the reward (`reward_kl`): per-token rewards r_t, and the group types' advantages of
                rewards minus each sample's KL sum
    distillation.py  the OPD advantage of on-policy distillation (`[teacher]`)

Every type is a config class in `configs/advantage.py` that says where it is computed (`computed_in`), and a
function here registered with `@ADVANTAGES.implements(ItsConfig)`; the contract of each kind is in that
module's docstring. Each process does what the config's plan says (`trainer_step`, `batch_fields`): the
orchestrator (`orchestrator/group_advantages.py`) computes its types and writes 0 with the rewards for the others;
the trainer (`trainer/rl/step_advantages.py`) computes its types and recomputes a group type with `reward_kl`,
with the reference model, the critic and its ranks.
What a loss then does with A (`loss.adv_tau`, `teacher_tau`, `kl_tau`) is the loss's (`trainer/rl/losses/`).
"""

from prime_rl.advantages import group, token  # noqa: F401  (registers the built-in types' functions)

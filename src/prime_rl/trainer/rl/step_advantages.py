"""The trainer's side of the advantages (the math: `prime_rl.advantages`), once per step before the update epochs.

The trainer does what the advantage config's `trainer_step` says (`configs/advantage.py`; the whole pipeline from
reward to the loss's advantage: docs/orchestrator.md#advantages):

- "tokens" (a type computed in the trainer: `gae`, `reinforce_plus_plus`): per packed row, r_t from the batch's
  `rewards` (minus coef * KL_t with `reward_kl`, `advantages.kl.token_rewards`), V_t from the critic (a type that
  `uses_critic`; else 0), then the type's function `fn(TokenRow, **arguments)`, whitened over the step's trained
  tokens on every rank when the config is `whitened`; the critic's targets are V_old and G = A + V (before
  whitening).
- "groups" (an orchestrator type with `reward_kl`): the type's own function of rewards minus each sample's KL
  sum, over the (group, reward, KL sum) rows of every rank (`advantages.kl.kl_group_advantages`).
- None: the batch's advantages as the orchestrator wrote them.

KL_t is the loss's `kl_estimate` (k1/k3) between the sampler's logprobs and the frozen reference model's, on
trained tokens; the reference logprobs computed here go into the batch for the loss's own KL term.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from prime_rl.advantages.kl import kl_group_advantages, sample_table, token_rewards
from prime_rl.advantages.token import TokenRow, token_moments, whiten_tokens
from prime_rl.batch_format import MicroBatch, RankBatch
from prime_rl.configs.advantage import AdvantageConfig
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer.critic import ValueTargets, value_metrics
from prime_rl.trainer.dist import all_gather_rows, all_reduce_sum
from prime_rl.trainer.model import compute_logprobs
from prime_rl.trainer.rl.losses import kl_estimate
from prime_rl.trainer.session import TrainSession
from prime_rl.utils.errors import PrimeError, UserError


def check_advantage_plan(batch: RankBatch, advantage: AdvantageConfig) -> None:
    """The batch must have been written for the trainer's advantage plan: of the same type when the trainer
    computes or recomputes the advantages (else it would train on the orchestrator's zeros, or compute another
    type's), and with exactly the optional fields the plan needs (`batch_fields`)."""
    theirs = batch.advantage  # None in files of older versions
    with_rewards = any(mb.rewards is not None or mb.sample_rewards is not None  # the orchestrator left them to us
                       for mb in batch.micro_batches)
    if theirs != advantage.type and (advantage.trainer_step is not None or with_rewards):
        named = f"type '{theirs}'" if theirs is not None else "an unrecorded type"
        raise UserError(f"step {batch.step}: the orchestrator computed advantages of {named} but the trainer runs "
                        f"'{advantage.type}': give both the same advantage type (rl hands it down)")
    folded = any(mb.sample_groups is not None for mb in batch.micro_batches)  # written for a "groups" step
    if advantage.computed_in == "orchestrator" and folded != (advantage.trainer_step == "groups"):
        raise UserError(f"step {batch.step}: the orchestrator {'runs' if folded else 'does not run'} "
                        f"advantage.reward_kl but the trainer {'does not' if folded else 'does'}: give both the "
                        "same advantage settings (rl hands them down)")


def step_advantages(session: TrainSession, batch: RankBatch, advantage: AdvantageConfig,
                    ref_model: torch.nn.Module | None, rule: SamplingRule
                    ) -> tuple[RankBatch, ValueTargets | None, dict[str, float]]:
    """The batch the step trains on (module docstring), the critic's targets (a trainer-computed type) and the
    step's advantage metrics."""
    check_advantage_plan(batch, advantage)
    if advantage.trainer_step == "tokens":
        return trainer_computed(session, batch, advantage, ref_model, rule)
    if advantage.trainer_step == "groups":
        batch, metrics = kl_group_batch(session, batch, advantage, ref_model, rule)
        return batch, None, metrics
    return batch, None, {}


def reference_kl(mb: MicroBatch, kind: str, ref_model: torch.nn.Module | None,
                 rule: SamplingRule) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL_t [T] float64 on trained tokens, 0 elsewhere; lref) of one micro-batch: the `kind` (k1/k3) estimate
    between the sampler's logprobs and the reference model's (the batch's `ref_logprobs` when it has them)."""
    lref = mb.ref_logprobs
    if lref is None:
        with torch.no_grad():
            lref = compute_logprobs(ref_model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)[0].cpu()
    return kl_estimate(mb.inference_logprobs.double(), lref.double(), kind) * mb.loss_mask, lref


def kl_group_batch(session: TrainSession, batch: RankBatch, advantage: AdvantageConfig,
                   ref_model: torch.nn.Module | None, rule: SamplingRule) -> tuple[RankBatch, dict[str, float]]:
    """The batch with the group type's advantages recomputed from rewards minus the KL to the reference
    (`advantages.kl`; every rank's samples gathered), and the step's mean KL per trained token."""
    tables, kls, refs = [], [], []
    for mb in batch.micro_batches:
        if mb.sample_groups is None or mb.sample_rewards is None:
            raise UserError(f"step {batch.step}: advantage.reward_kl needs the batch's sample groups and rewards, "
                            "which this batch lacks (the orchestrator must run the same advantage settings)")
        kl, lref = reference_kl(mb, advantage.reward_kl.estimator, ref_model, rule)
        kl_sums = torch.segment_reduce(kl, "sum", lengths=mb.sample_lens)
        tables.append(sample_table(mb.sample_groups, mb.sample_rewards, kl_sums))
        kls.append(kl), refs.append(lref)
    device = session.dist.device
    ours = kl_group_advantages(all_gather_rows(torch.cat(tables), device), advantage)[session.dist.rank]
    micro_batches = []
    for mb, a, ref in zip(batch.micro_batches, torch.split(ours, [t.shape[0] for t in tables]), refs, strict=True):
        per_segment = torch.zeros(mb.sample_lens.shape, dtype=torch.float64)
        per_segment[mb.sample_groups >= 0] = a
        tokens = torch.repeat_interleave(per_segment, mb.sample_lens) * mb.loss_mask
        micro_batches.append(replace(mb, advantages=tokens.float(), ref_logprobs=ref))
    kl_sum, count = all_reduce_sum([float(sum(k.sum() for k in kls)),
                                    float(sum(mb.num_loss_tokens for mb in batch.micro_batches))], device)
    return replace(batch, micro_batches=micro_batches), {"advantage/kl_in_reward": kl_sum / max(count, 1.0)}


def trainer_computed(session: TrainSession, batch: RankBatch, advantage: AdvantageConfig,
                     ref_model: torch.nn.Module | None, rule: SamplingRule
                     ) -> tuple[RankBatch, ValueTargets, dict[str, float]]:
    """The batch with each micro-batch's advantages replaced by the trainer-computed type's (module docstring),
    V_old and the returns G per micro-batch (the critic's targets), and the step's advantage metrics."""
    function = advantage.function()
    reward_kl = advantage.reward_kl
    values, returns, rows, masks, kls, refs = [], [], [], [], [], []
    for mb in batch.micro_batches:
        if mb.rewards is None:
            raise UserError(f"step {batch.step}: advantage type '{advantage.type}' needs the batch's rewards, which "
                            "this batch lacks (the orchestrator must run the same advantage type)")
        mask = mb.loss_mask
        kl = None
        if reward_kl is not None:
            kl, lref = reference_kl(mb, reward_kl.estimator, ref_model, rule)
            kls.append(kl)
        if session.critic is not None:
            with torch.no_grad():
                value = session.critic.values(mb).double().cpu() * mask
        else:
            value = torch.zeros(mb.num_tokens, dtype=torch.float64)
        rewards = token_rewards(mb.rewards, mask, kl, reward_kl.coef if reward_kl is not None else 0.0)
        a = function(TokenRow(rewards, value, mask, mb.sample_lens))
        if not isinstance(a, torch.Tensor) or a.shape != mask.shape:
            got = tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__
            raise PrimeError(f"advantage type '{advantage.type}' returned {got} for a row of {mb.num_tokens} tokens")
        rows.append(a), values.append(value), returns.append((a + value) * mask), masks.append(mask)
        refs.append(lref if kl is not None else mb.ref_logprobs)  # the loss's KL term reuses them
    device = session.dist.device
    raw = all_reduce_sum(token_moments(rows, masks), device)
    metrics = {"advantage/token_mean": raw[0] / max(raw[2], 1.0)}
    if kls:
        (kl_sum,) = all_reduce_sum([float(sum(k.sum() for k in kls))], device)
        metrics["advantage/kl_in_reward"] = kl_sum / max(raw[2], 1.0)
    if advantage.whitened:
        rows = whiten_tokens(rows, masks, raw)
    if session.critic is not None:
        metrics |= value_metrics(values, returns, masks, device)
    micro_batches = [replace(mb, advantages=a.float(), ref_logprobs=ref)
                     for mb, a, ref in zip(batch.micro_batches, rows, refs, strict=True)]
    return replace(batch, micro_batches=micro_batches), ValueTargets(values, returns, raw[2]), metrics

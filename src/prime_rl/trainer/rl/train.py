"""`trainer` entrypoint: the RL training loop.

    trainer @ trainer.toml [--key value ...]                                   # one process
    torchrun --nproc-per-node K -m prime_rl.trainer.rl.train @ trainer.toml    # K ranks

Step N (0-based) reads `rollouts/step_N/rank_R.pt`; under a token-level advantage type
(`reinforce_plus_plus`, `gae`) it first turns the batch's rewards into per-token advantages
(`token_advantage.py`; `gae` with the critic's values: `critic.py`, `value_head.py`), under a group type with
`kl_in_reward` it recomputes the group advantages from rewards minus the KL (`group_kl.py`). It then computes trainer
logprobs under the batch's sampling rule (temperature and truncation), the configured loss over
all micro-batches with a global `LossScale`, takes `update_epochs` optimizer steps on it (the
loss metrics logged are the last pass's, so with several passes they show the policy's drift
from the sampler; the critic takes one step per pass too: a value head's loss joins the policy's backward), and
writes `weights/step_{N+1}/`.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from prime_rl.configs.advantage import AdvantageConfig
from prime_rl.configs.cli import run_main
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.critic import ValueTargets, value_loss, value_metrics
from prime_rl.trainer.data import wait_for_batch
from prime_rl.trainer.dist import all_gather_rows, all_reduce_pairs, all_reduce_sum, destroy
from prime_rl.trainer.model import compute_logprobs, compute_logprobs_and_hidden, load_model, prepare_model
from prime_rl.trainer.rl.group_kl import group_advantages, sample_table
from prime_rl.trainer.rl.loss import (
    Loss,
    LossInputs,
    LossScale,
    build_loss,
    kl_estimate,
    log_ratio_moments,
    reduce_metrics,
    scale_counts,
)
from prime_rl.trainer.rl.token_advantage import gae, moments, token_rewards, whiten
from prime_rl.trainer.session import TrainSession
from prime_rl.trainer.value_head import ValueHead
from prime_rl.utils.batch_format import MicroBatch, RankBatch
from prime_rl.utils.errors import UserError
from prime_rl.utils.sampling_rule import SamplingRule


def step_scale(batch: RankBatch, device: torch.device) -> LossScale:
    """The step's denominators: `scale_counts` of every micro-batch of every rank, summed. Micro-batches
    count (M of `token_local`) only when they hold a trained token, so the padding rows that even out
    the ranks' micro-batch counts do not change the loss with the number of ranks."""
    counts = sum((scale_counts(mb) for mb in batch.micro_batches), torch.zeros(3, dtype=torch.long))
    return LossScale.from_counts(all_reduce_sum(counts.tolist(), device), max_tokens=batch.max_tokens)


def loss_inputs(mb: MicroBatch, logprobs: torch.Tensor, entropies: torch.Tensor,
                ref_logprobs: torch.Tensor | None) -> LossInputs:
    """The loss library's view of one micro-batch (batch tensors moved to the logprobs' device)."""
    def to(t):
        return t.to(logprobs.device) if t is not None else None

    return LossInputs(
        trainer_logprobs=logprobs,
        inference_logprobs=to(mb.inference_logprobs),
        advantages=to(mb.advantages),
        loss_mask=to(mb.loss_mask),
        sample_lens=to(mb.sample_lens),
        ref_logprobs=ref_logprobs if ref_logprobs is not None else to(mb.ref_logprobs),
        teacher_logprobs=to(mb.teacher_logprobs),
        entropies=entropies,
    )


def train_on_batch(session: TrainSession, loss_fn: Loss, batch: RankBatch, scale: LossScale,
                   ref_model: torch.nn.Module | None = None, match_truncation: bool = True,
                   targets: ValueTargets | None = None) -> tuple[float, dict[str, float]]:
    """Forward/backward every micro-batch of this rank; returns the global step loss that was backpropagated and
    the metrics (`loss/total`: the policy's loss).

    A loss that needs a statistic of the whole step (`loss_fn.needs_log_ratio_moments`: is_reshape's
    variance of log r) first gets it from a no-grad forward of every micro-batch, all-reduced over
    ranks, so its update does not depend on how the step is split into micro-batches or ranks.
    Metrics are `[sum, count]` pairs per micro-batch; they are summed here, all-reduced, then divided.
    Tokens are scored under the batch's sampling rule (temperature, and its truncation when
    `match_truncation`: `model.token_logprobs`); the reference model's too, so both sides of the KL agree.
    With a value head (`session.critic` a `ValueHead`; `targets`: V_old and G) each micro-batch's loss is the
    joint L_policy + c_V * L_V, V read from the same forward's final hidden states (`value_head.py`).
    """
    rule = scoring_rule(batch, match_truncation, session.sampled_vocab)
    if loss_fn.needs_log_ratio_moments:
        moments = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for mb in batch.micro_batches:
                lp, _ = compute_logprobs(session.model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)
                moments += log_ratio_moments(loss_inputs(mb, lp, None, None))
        scale = scale.with_log_ratio_moments(all_reduce_sum(moments.tolist(), session.dist.device))
    head = session.critic if isinstance(session.critic, ValueHead) else None
    loss_sum, policy_sum = 0.0, 0.0
    pairs: list[dict[str, torch.Tensor]] = []
    for i, mb in enumerate(batch.micro_batches):
        ref = None
        if ref_model is not None and mb.ref_logprobs is None:
            with torch.no_grad():
                ref = compute_logprobs(ref_model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)[0]
        if head is None:
            lp, ent = compute_logprobs(session.model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)
        else:
            lp, ent, hidden = compute_logprobs_and_hidden(session.model, mb.input_ids, mb.position_ids,
                                                          mb.sample_lens, rule)
        out = loss_fn(loss_inputs(mb, lp, ent, ref), scale)
        loss = out.loss
        pairs.append(out.metrics)
        if head is not None:
            value_share, value_pairs = value_loss(head.values_of(hidden, mb.sample_lens), targets.old_values[i],
                                                  targets.returns[i], mb.loss_mask, targets.count,
                                                  head.config.value_clip)
            loss = loss + head.coef * value_share
            pairs.append(value_pairs)
        session.backward(loss)
        loss_sum += float(loss.detach())
        policy_sum += float(out.loss.detach())
    # the keys are the same on every rank: they depend on the config, not the data
    totals, (total, policy_total) = all_reduce_pairs(pairs, session.dist.device, [loss_sum, policy_sum])
    metrics = reduce_metrics([totals])
    metrics["loss/total"] = policy_total
    return total, metrics


def scoring_rule(batch: RankBatch, match_truncation: bool, vocab: int | None = None) -> SamplingRule:
    """The rule the trainer scores the batch's tokens under: the sampler's whole rule with `match_truncation`,
    else its temperature alone; over the sampled vocabulary [0, vocab) (`utils.vocabulary`)."""
    rule = batch.rule if match_truncation else SamplingRule(batch.temperature)
    return replace(rule, vocab=vocab)


def check_advantage_type(batch: RankBatch, advantage: AdvantageConfig) -> None:
    """The orchestrator's advantage type (in the batch) must be the trainer's when either is token-level: else
    the trainer would train on the orchestrator's zero placeholders, or compute another type's advantages."""
    theirs = batch.advantage  # None in files of older versions
    with_rewards = any(mb.rewards is not None or mb.sample_rewards is not None  # the orchestrator left them to us
                       for mb in batch.micro_batches)
    if theirs != advantage.type and (advantage.token_level or advantage.group_kl or with_rewards):
        named = f"type '{theirs}'" if theirs is not None else "an unrecorded type"
        raise UserError(f"step {batch.step}: the orchestrator computed advantages of {named} but the trainer runs "
                        f"'{advantage.type}': give both the same advantage type (rl hands it down)")
    folded = any(mb.sample_groups is not None for mb in batch.micro_batches)  # a group type's kl_in_reward
    if not advantage.token_level and folded != advantage.group_kl:
        raise UserError(f"step {batch.step}: the orchestrator {'runs' if folded else 'does not run'} "
                        f"advantage.kl_in_reward but the trainer {'does not' if folded else 'does'}: give both the "
                        "same advantage settings (rl hands them down)")


def reference_kl(mb: MicroBatch, kind: str, ref_model: torch.nn.Module | None,
                 rule: SamplingRule) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL_t [T] float64 on trained tokens, 0 elsewhere; lref) of one micro-batch: the `kind` (k1/k3) estimate
    between the sampler's logprobs and the reference model's (the batch's `ref_logprobs` when it has them)."""
    lref = mb.ref_logprobs
    if lref is None:
        with torch.no_grad():
            lref = compute_logprobs(ref_model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)[0].cpu()
    return kl_estimate(mb.inference_logprobs.double(), lref.double(), kind) * mb.loss_mask, lref


def group_kl_batch(session: TrainSession, batch: RankBatch, advantage: AdvantageConfig,
                   ref_model: torch.nn.Module | None, rule: SamplingRule) -> tuple[RankBatch, dict[str, float]]:
    """The batch with the group type's advantages recomputed from rewards minus the KL to the reference
    (`group_kl.py`; every rank's samples gathered), and the step's mean KL per trained token."""
    tables, kls, refs = [], [], []
    for mb in batch.micro_batches:
        if mb.sample_groups is None or mb.sample_rewards is None:
            raise UserError(f"step {batch.step}: advantage.kl_in_reward needs the batch's sample groups and rewards, "
                            "which this batch lacks (the orchestrator must run the same advantage settings)")
        kl, lref = reference_kl(mb, advantage.kl_in_reward, ref_model, rule)
        kl_sums = torch.segment_reduce(kl, "sum", lengths=mb.sample_lens)
        tables.append(sample_table(mb.sample_groups, mb.sample_rewards, kl_sums))
        kls.append(kl), refs.append(lref)
    device = session.dist.device
    ours = group_advantages(all_gather_rows(torch.cat(tables), device), advantage)[session.dist.rank]
    micro_batches = []
    for mb, a, ref in zip(batch.micro_batches, torch.split(ours, [t.shape[0] for t in tables]), refs, strict=True):
        per_segment = torch.zeros(mb.sample_lens.shape, dtype=torch.float64)
        per_segment[mb.sample_groups >= 0] = a
        tokens = torch.repeat_interleave(per_segment, mb.sample_lens) * mb.loss_mask
        micro_batches.append(replace(mb, advantages=tokens.float(), ref_logprobs=ref))
    kl_sum, count = all_reduce_sum([float(sum(k.sum() for k in kls)),
                                    float(sum(mb.num_loss_tokens for mb in batch.micro_batches))], device)
    return replace(batch, micro_batches=micro_batches), {"advantage/kl_in_reward": kl_sum / max(count, 1.0)}


def token_level_advantages(session: TrainSession, batch: RankBatch, advantage: AdvantageConfig,
                           ref_model: torch.nn.Module | None, rule: SamplingRule
                           ) -> tuple[RankBatch, ValueTargets, dict[str, float]]:
    """The batch with each micro-batch's advantages replaced by the token-level type's (`token_advantage`:
    rewards, the KL to the reference with `kl_in_reward`, the critic's V_old for `gae`, whitened over the
    step), V_old and the returns G per micro-batch (the critic's targets), and the step's advantage metrics."""
    values, returns, rows, masks, kls, refs = [], [], [], [], [], []
    lam = advantage.lam if advantage.type == "gae" else 1.0
    for mb in batch.micro_batches:
        if mb.rewards is None:
            raise UserError(f"step {batch.step}: advantage type '{advantage.type}' needs the batch's rewards, which "
                            "this batch lacks (the orchestrator must run the same advantage type)")
        mask = mb.loss_mask
        kl = None
        if advantage.kl_in_reward is not None:
            kl, lref = reference_kl(mb, advantage.kl_in_reward, ref_model, rule)
            kls.append(kl)
        if session.critic is not None:
            with torch.no_grad():
                value = session.critic.values(mb).double().cpu() * mask
        else:
            value = torch.zeros(mb.num_tokens, dtype=torch.float64)
        a, g = gae(token_rewards(mb.rewards, mask, kl, advantage.kl_coef), value, mask, mb.sample_lens,
                   advantage.gamma, lam)
        rows.append(a), values.append(value), returns.append(g), masks.append(mask)
        refs.append(lref if kl is not None else mb.ref_logprobs)  # the loss's KL term reuses them
    device = session.dist.device
    raw = all_reduce_sum(moments(rows, masks), device)
    metrics = {"advantage/token_mean": raw[0] / max(raw[2], 1.0)}
    if kls:
        (kl_sum,) = all_reduce_sum([float(sum(k.sum() for k in kls))], device)
        metrics["advantage/kl_in_reward"] = kl_sum / max(raw[2], 1.0)
    if advantage.type == "reinforce_plus_plus" or advantage.whiten:
        rows = whiten(rows, masks, raw)
    if session.critic is not None:
        metrics |= value_metrics(values, returns, masks, device)
    micro_batches = [replace(mb, advantages=a.float(), ref_logprobs=ref)
                     for mb, a, ref in zip(batch.micro_batches, rows, refs, strict=True)]
    return replace(batch, micro_batches=micro_batches), ValueTargets(values, returns, raw[2]), metrics


def train(config: TrainerConfig) -> None:
    # Dropout off: the loss's logprobs must be those of the policy the server sampled from (docs/trainer.md#lora).
    session = TrainSession(config, "trainer", dropout=False)
    loss_fn = build_loss(config.loss)
    ref_model = None
    if config.loss.kl_coef > 0 or getattr(config.advantage, "kl_in_reward", None) is not None:
        # Frozen copy of the initial policy (model.name), also when resuming from a checkpoint.
        device = session.dist.device
        ref_model = prepare_model(load_model(config.model, config.runtime, device), config.runtime, device,
                                  trainable=False)
    try:
        session.publish_resumed_weights()
        for step in range(session.start_step, config.max_steps):
            batch, waited = wait_for_batch(config.output_dir, step, session.dist.rank, config.batch_timeout_s,
                                           config.max_async_level)
            start = time.perf_counter()
            scale = step_scale(batch, session.dist.device)
            lr = session.lr
            token_metrics, critic_metrics = {}, {}
            check_advantage_type(batch, config.advantage)
            rule = scoring_rule(batch, config.match_truncation, session.sampled_vocab)
            targets = None
            if config.advantage.token_level:
                batch, targets, token_metrics = token_level_advantages(session, batch, config.advantage, ref_model,
                                                                       rule)
            elif config.advantage.group_kl:
                batch, token_metrics = group_kl_batch(session, batch, config.advantage, ref_model, rule)
            for _ in range(config.update_epochs):
                total_loss, metrics = train_on_batch(session, loss_fn, batch, scale, ref_model,
                                                     config.match_truncation, targets)
                grad_norm = session.optimizer_step(step, total_loss)
                if isinstance(session.critic, ValueHead):  # its value loss was in the joint backward
                    critic_metrics = {"value/grad_norm": session.critic.step(step, total_loss)}
                elif session.critic is not None:
                    critic_metrics = session.critic.train_epoch(batch.micro_batches, targets,
                                                                session.dist.world_size, step)
            metrics |= token_metrics | critic_metrics
            session.scheduler.step()
            step_time = time.perf_counter() - start
            tokens = sum(mb.num_tokens for mb in batch.micro_batches) * config.update_epochs
            # A segment's full length (a branch counts its shared root): the attention span in perf/mfu.
            spans = torch.cat([mb.position_ids[mb.sample_lens.cumsum(0) - 1] + 1 for mb in batch.micro_batches])
            metrics.update({"optim/lr": lr, "optim/grad_norm": grad_norm, "async/wait_for_batch_s": waited,
                            "perf/trainer_idle_frac": waited / max(waited + step_time, 1e-9)})
            metrics.update(session.perf_metrics(tokens, step_time, float(spans.float().mean())))
            session.log_metrics(metrics, step)
            session.after_step(step + 1, write=True)
    finally:
        session.close()
        destroy()


def main(argv: list[str] | None = None) -> None:
    run_main(TrainerConfig, train, argv)


if __name__ == "__main__":
    main()

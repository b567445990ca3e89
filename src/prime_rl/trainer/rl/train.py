"""`trainer` entrypoint: the RL training loop.

    trainer @ trainer.toml [--key value ...]                                   # one process
    torchrun --nproc-per-node K -m prime_rl.trainer.rl.train @ trainer.toml    # K ranks

Step N (0-based) reads `rollouts/step_N/rank_R.pt` and first does its advantage config's `trainer_step`
(`step_advantages.py`: per-token advantages of a type computed in the trainer, with a critic's values for one that
`uses_critic`; a group type's recomputed from rewards minus the KL under `reward_kl`). It then computes trainer
logprobs under the batch's sampling rule (temperature and truncation), the configured loss over
all micro-batches with a global `LossScale`, takes `update_epochs` optimizer steps on it (the
loss metrics logged are the last pass's, so with several passes they show the policy's drift
from the sampler; the critic takes one step per pass too: a value head's loss joins the policy's backward), and
writes `weights/step_{N+1}/`. On a step whose batch records samples (`sample_keys`), the first pass's logprob and loss
outcome of their tokens go to `rollouts/step_N/token_outcomes_rank_R.jsonl` (`token_outcomes.py`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import torch

from prime_rl.batch_format import MicroBatch, RankBatch
from prime_rl.configs.cli import run_main
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.critic import Critic, SeparateCritic, ValueTargets
from prime_rl.trainer.dist import all_reduce_pairs, all_reduce_sum, destroy
from prime_rl.trainer.model import (
    compute_logprobs,
    compute_logprobs_and_hidden,
    load_model,
    prepare_model,
)
from prime_rl.trainer.rl.loss import STEP_STATISTICS, Loss, build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale, reduce_metrics, scale_counts
from prime_rl.trainer.rl.old_policy import OldPolicy
from prime_rl.trainer.rl.rollout_batches import wait_for_batch
from prime_rl.trainer.rl.step_advantages import step_advantages
from prime_rl.trainer.rl.token_outcomes import micro_batch_outcomes, write_outcomes
from prime_rl.trainer.session import TrainSession
from prime_rl.trainer.value_head import ValueHeadCritic


def build_critic(config: TrainerConfig, session: TrainSession) -> Critic:
    """The critic `critic_in_use` names, on the session's policy: a value head on it, or a separate model."""
    critic = config.critic_in_use
    if critic.type == "value_head":
        return ValueHeadCritic(critic, session.model, session.dist.device, config.seed)
    return SeparateCritic(critic, config.model, config.runtime, session.dist.device, config.seed,
                          session.model_config.vocab_size)


def step_scale(batch: RankBatch, device: torch.device) -> LossScale:
    """The step's denominators: `scale_counts` of every micro-batch of every rank, summed. Micro-batches
    count (M of `token_local`) only when they hold a trained token, so the padding rows that even out
    the ranks' micro-batch counts do not change the loss with the number of ranks."""
    counts = sum((scale_counts(mb) for mb in batch.micro_batches), torch.zeros(3, dtype=torch.long))
    return LossScale.from_counts(all_reduce_sum(counts.tolist(), device), max_tokens=batch.max_tokens)


def loss_inputs(mb: MicroBatch, logprobs: torch.Tensor, entropies: torch.Tensor,
                ref_logprobs: torch.Tensor | None, old_logprobs: torch.Tensor | None = None) -> LossInputs:
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
        old_logprobs=old_logprobs,
    )


def train_on_batch(session: TrainSession, loss_fn: Loss, batch: RankBatch, scale: LossScale,
                   ref_model: torch.nn.Module | None = None, match_truncation: bool = True,
                   targets: ValueTargets | None = None, outcomes: list[dict] | None = None,
                   old: OldPolicy | None = None) -> tuple[float, dict[str, float]]:
    """Forward/backward every micro-batch of this rank; returns the global step loss that was backpropagated and
    the metrics (`loss/total`: the policy's loss).

    A loss that needs a statistic of the whole step (`loss_fn.needs_step_pass`: is_reshape's variance of log r, the
    correction's mean weight) first gets it from a no-grad forward of every micro-batch, all-reduced over
    ranks, so its update does not depend on how the step is split into micro-batches or ranks. `old`: the old policy's
    logprobs lo of each micro-batch, as the loss asks for them (`old_policy.OldPolicy`; default: what `loss_fn` reads
    with one update epoch).
    Metrics are `[sum, count]` pairs per micro-batch; they are summed here, all-reduced, then divided.
    Tokens are scored under the batch's sampling rule (temperature, and its truncation when
    `match_truncation`: `model.token_logprobs`); the reference model's too, so both sides of the KL agree.
    With a joint critic (`session.critic.joint`: a value head; `targets`: V_old and G) each micro-batch's loss is
    the joint L_policy + c_V * L_V, V read from the same forward's final hidden states (`value_head.py`).
    Given `outcomes`, the records of the micro-batches' recorded samples are appended to it (`token_outcomes.py`).
    """
    rule = scoring_rule(batch, match_truncation, session.sampled_vocab)
    old = old if old is not None else OldPolicy(loss_fn.needs_old_logprobs, update_epochs=1)
    if loss_fn.needs_step_pass:
        sums = torch.zeros(STEP_STATISTICS, dtype=torch.float64)
        with torch.no_grad():
            for i, mb in enumerate(batch.micro_batches):
                lp = old.known(i)
                if lp is None or loss_fn.needs_log_ratio_moments:  # the weights' mean reads lo and lq only
                    lp, _ = compute_logprobs(session.model, mb.input_ids, mb.position_ids, mb.sample_lens, rule,
                                             mb.scored_tokens)
                sums += loss_fn.step_statistics(loss_inputs(mb, lp, None, None, old.of(i, lp)))
        scale = loss_fn.with_step_statistics(scale, all_reduce_sum(sums.tolist(), session.dist.device))
    head = session.critic if session.critic is not None and session.critic.joint else None
    loss_sum, policy_sum = 0.0, 0.0
    pairs: list[dict[str, torch.Tensor]] = []
    for i, mb in enumerate(batch.micro_batches):
        ref = None
        if ref_model is not None and mb.ref_logprobs is None:
            with torch.no_grad():
                ref = compute_logprobs(ref_model, mb.input_ids, mb.position_ids, mb.sample_lens, rule)[0]
        if head is None:
            lp, ent = compute_logprobs(session.model, mb.input_ids, mb.position_ids, mb.sample_lens, rule,
                                       mb.scored_tokens)
        else:
            lp, ent, hidden = compute_logprobs_and_hidden(session.model, mb.input_ids, mb.position_ids,
                                                          mb.sample_lens, rule)
        record = outcomes is not None and mb.sample_keys is not None
        out = loss_fn(loss_inputs(mb, lp, ent, ref, old.of(i, lp)), scale, outcomes=record)
        if record:
            outcomes += micro_batch_outcomes(mb, lp, out.outcomes)
        loss = out.loss
        pairs.append(out.metrics)
        if head is not None:
            value_share, value_pairs = head.joint_loss(hidden, mb, targets.old_values[i], targets.returns[i],
                                                       targets.count)
            loss = loss + value_share
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
    else its temperature alone; over the sampled vocabulary [0, vocab) (`models.vocabulary`)."""
    rule = batch.rule if match_truncation else SamplingRule(batch.temperature)
    return replace(rule, vocab=vocab)


def train(config: TrainerConfig) -> None:
    # Dropout off: the loss's logprobs must be those of the policy the server sampled from (docs/trainer.md#lora).
    critic = functools.partial(build_critic, config) if config.critic_in_use is not None else None
    session = TrainSession(config, "trainer", dropout=False, sampled_vocab=config.sampled_vocab,
                           transfer=config.weight_transfer, critic=critic)
    loss_fn = build_loss(config.loss)
    old = OldPolicy(loss_fn.needs_old_logprobs, config.update_epochs)
    ref_model = None
    if config.loss.kl_coef > 0 or config.advantage.reward_kl is not None:
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
            critic_metrics = {}
            rule = scoring_rule(batch, config.match_truncation, session.sampled_vocab)
            batch, targets, advantage_metrics = step_advantages(session, batch, config.advantage, ref_model, rule)
            recorded = [] if any(mb.sample_keys is not None for mb in batch.micro_batches) else None
            old.before_step(session.model, batch, rule)
            for epoch in range(config.update_epochs):
                total_loss, metrics = train_on_batch(session, loss_fn, batch, scale, ref_model,
                                                     config.match_truncation, targets, recorded if epoch == 0 else None,
                                                     old)
                grad_norm = session.optimizer_step(step, total_loss)
                if session.critic is not None:
                    critic_metrics = session.critic.train_epoch(batch.micro_batches, targets, step, total_loss)
            metrics |= advantage_metrics | critic_metrics
            if recorded is not None:
                write_outcomes(config.output_dir, step, session.dist.rank, recorded)
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

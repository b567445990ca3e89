"""The critic of an advantage type that `uses_critic` (`gae`): the `Critic` protocol both kinds follow, the value
loss they train on, and the separate critic, `SeparateCritic` (`critic.type = "separate"`; the other kind, a head
on the policy, is `value_head.ValueHeadCritic`). The RL loop builds the one its config names
(`trainer/rl/train.build_critic`) and hands it to its `TrainSession`, which checkpoints it with the policy.

V is a separate model: the policy's architecture (from `critic.model`, else the policy's own weights)
with a one-output token-classification head (`AutoModelForTokenClassification`, num_labels = 1; the
head is new, drawn from the seed), sharded with FSDP2 like the policy and run in eval mode (no
dropout, so V is a function of the tokens). The value of trained token t is the head's output at
position t - 1, the state the policy sampled token t from (`model.from_previous_position`; the first
token of a segment is never trained, so t - 1 is always in the same segment).

Per update epoch the critic takes one AdamW step on PPO's clipped value loss L_V (`value_loss`): its values
regressed on the GAE returns G, each new value clipped to within `value_clip` of V_old, the values the advantages
were computed with (without `value_clip` the plain squared error), averaged over the step's trained tokens on all
ranks. The formula: docs/losses.md#ppo-with-a-critic-gae. Logged: `value/loss` (last epoch), `value/mean`,
`value/explained_variance`, `value/clip_frac`, `value/grad_norm` (docs/metrics.md#value-trainer-advantage-type-gae).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from transformers import AutoModelForTokenClassification

from prime_rl.batch_format import MicroBatch
from prime_rl.configs.shared import ModelConfig
from prime_rl.models.embedded import resolve_model_path
from prime_rl.trainer.config import CriticConfig, RuntimeConfig
from prime_rl.trainer.dist import all_reduce_pairs, all_reduce_sum
from prime_rl.trainer.model import (
    forward_rows_logits,
    from_previous_position,
    load_pretrained,
    on_model_device,
    prepare_model,
)
from prime_rl.trainer.optim import build_optimizer, checked_step
from prime_rl.trainer.rl.losses import reduce_metrics
from prime_rl.utils.errors import UserError


@dataclass(frozen=True)
class ValueTargets:
    """What the value loss of one step regresses on: per micro-batch of this rank V_old [T] and the GAE returns
    G [T] (`rl/advantage.trainer_computed`), and N, the step's trained tokens on all ranks."""

    old_values: list[torch.Tensor]
    returns: list[torch.Tensor]
    count: float


def value_loss(values: torch.Tensor, old: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, count: float,
               clip: float | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch's share of the clipped value loss L_V (module docstring): its half squared error summed
    over the micro-batch's trained tokens and divided by `count` (N, the step's trained tokens on all ranks), so the
    shares sum to L_V; and its metrics as `[sum, count]` pairs (`rl.losses.reduce_metrics`): `value/loss` [the
    micro-batch's summed half squared error, n] and `value/clip_frac` [tokens whose value moved more than `clip`
    from `old`, n], n = the micro-batch's trained tokens. `values` V carries the gradient; `old`, `target` (any
    device, float) are constants."""
    old, target = old.to(values.device, torch.float32), target.to(values.device, torch.float32)
    mask = mask.to(values.device)
    error = (values - target).square()
    clipped = torch.zeros((), device=values.device)
    if clip is not None:
        moved = values - old
        error = torch.maximum(error, (old + moved.clamp(-clip, clip) - target).square())
        clipped = (moved.detach().abs() > clip)[mask].sum().float()
    half_sum = 0.5 * (error * mask).sum()
    n = mask.sum().float()
    metrics = {"value/loss": torch.stack([half_sum.detach(), n]), "value/clip_frac": torch.stack([clipped, n])}
    return half_sum / max(count, 1.0), metrics


class Critic(Protocol):
    """A learned value function V_t (module docstring) as the RL loop and the checkpoints use it."""

    config: CriticConfig
    model: torch.nn.Module
    """What is checkpointed beside the policy as "critic" (`trainer_ckpt`), with `optimizer` as "critic_optim"."""
    optimizer: torch.optim.Optimizer
    joint: bool
    """Its value loss joins the policy's backward (a value head reads the policy's own final hidden states), so the
    loop adds `joint_loss` (a `JointCritic`'s) to each micro-batch's policy loss; else it trains in a pass of its
    own (`train_epoch`)."""

    def values(self, mb: MicroBatch) -> torch.Tensor:
        """V [T] float32 of a packed row (call under `torch.no_grad()` for V_old)."""
        ...

    def train_epoch(self, batch: list[MicroBatch], targets: ValueTargets, step: int,
                    policy_loss: float) -> dict[str, float]:
        """Collective, once per update epoch after the policy's optimizer step: the critic's own step; returns its
        `value/*` metrics. `policy_loss`: the epoch's (all-reduced) policy loss (a joint critic's finite check)."""
        ...


class JointCritic(Critic, Protocol):
    """A critic whose value loss joins the policy's backward (`joint`)."""

    def joint_loss(self, hidden: torch.Tensor, mb: MicroBatch, old: torch.Tensor, target: torch.Tensor,
                   count: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """c_V times this micro-batch's share of L_V, V read from `hidden` (the policy forward's final hidden
        states), and its metric pairs (`value_loss`)."""
        ...


class SeparateCritic:
    """The separate critic: its own model and optimizer (checkpointed with the policy: `trainer_ckpt`)."""

    joint = False

    def __init__(self, config: CriticConfig, policy: ModelConfig, runtime: RuntimeConfig, device: torch.device,
                 seed: int, vocab_size: int):
        self.config = config
        self.device = device
        path = resolve_model_path(config.model) if config.model is not None else policy.path
        with torch.random.fork_rng(devices=[]):  # the new head's init, the same on every rank and run
            torch.manual_seed(seed)
            net = load_pretrained(AutoModelForTokenClassification, path, policy, runtime, device, num_labels=1)
        if net.config.vocab_size != vocab_size:  # it reads the policy's token ids
            raise UserError(f"critic.model {config.model!r} has a vocabulary of {net.config.vocab_size} tokens, the "
                            f"policy {vocab_size}: the critic must share the policy's tokenizer")
        self.model = prepare_model(net, runtime, device)
        self.model.eval()
        self.optimizer = build_optimizer(self.model, config.optim)

    def values(self, mb: MicroBatch) -> torch.Tensor:
        """V [T] float32 of a packed row (module docstring: token t's value is the output at t - 1); 0 at
        each segment's first token. Gradients flow unless called under `torch.no_grad()`."""
        rows = on_model_device(self.model, [(mb.input_ids, mb.position_ids, mb.sample_lens)])
        return from_previous_position(forward_rows_logits(self.model, rows)[0][:, 0], mb.sample_lens)

    def train_epoch(self, batch: list[MicroBatch], targets: ValueTargets, step: int,
                    policy_loss: float) -> dict[str, float]:
        """One pass of the clipped value loss over this rank's micro-batches and one AdamW step."""
        world_size = dist.get_world_size() if dist.is_initialized() else 1
        pairs = []
        for mb, old, target in zip(batch, targets.old_values, targets.returns, strict=True):
            loss, metrics = value_loss(self.values(mb), old, target, mb.loss_mask, targets.count,
                                       self.config.value_clip)
            (loss * world_size).backward()  # FSDP averages over ranks; the loss is already a global sum
            pairs.append(metrics)
        totals, _ = all_reduce_pairs(pairs, self.device)
        metrics = reduce_metrics([totals])
        grad_norm = checked_step(self.model, self.optimizer, self.config.optim.max_norm,
                                 metrics.get("value/loss", 0.0), f"critic step {step}")
        return metrics | {"value/grad_norm": grad_norm}


def value_metrics(old_values: list[torch.Tensor], returns: list[torch.Tensor], masks: list[torch.Tensor],
                  device: torch.device) -> dict[str, float]:
    """`value/mean` and `value/explained_variance` (docs/metrics.md#value-trainer-advantage-type-gae) over the
    step's trained tokens on all ranks; the explained variance is 0 when Var(G) = 0."""
    sums = torch.zeros(6, dtype=torch.float64)
    for v, g, m in zip(old_values, returns, masks, strict=True):
        v, g = v.double().cpu()[m.cpu()], g.double().cpu()[m.cpu()]
        sums += torch.stack([v.sum(), g.sum(), g.square().sum(), (g - v).sum(), (g - v).square().sum(),
                             torch.tensor(float(m.sum()), dtype=torch.float64)])
    v_sum, g_sum, g_sq, e_sum, e_sq, n = all_reduce_sum(sums.tolist(), device)
    if n == 0:
        return {}
    var_g = g_sq / n - (g_sum / n) ** 2
    var_e = e_sq / n - (e_sum / n) ** 2
    return {"value/mean": v_sum / n, "value/explained_variance": 1 - var_e / var_g if var_g > 1e-12 else 0.0}

"""The value-head critic of the `gae` advantage type (`critic.type = "value_head"`): V on the policy itself.

A linear head, w [1, H] and b, on the policy's final hidden state h (the input of its output embedding,
lm_head) one position back (0 at every segment's first token; `model.from_previous_position`). w and b are
float32, drawn from the seed as the separate critic's new head is (the same on every rank and run). The head is
not part of the policy model, so the weights sent to the inference servers never hold it; it is checkpointed
beside the policy as the separate critic is ("critic", "critic_optim").

Training is joint (shared-backbone PPO): per micro-batch one backward of the policy loss plus `critic.value_coef`
times the separate critic's clipped value loss (`critic.value_loss`), with h taken from the same forward that
scores the policy's tokens (`model.forward_rows`, `hidden=True`). The head's gradient, scaled by the coefficient
in that backward, is divided by it again in `step`, so that the head's own AdamW (`critic.optim`: lr, max_norm)
and `value/grad_norm` see the value loss's gradient as the separate critic's do; the trunk is stepped by the
policy's AdamW. The formulas: docs/losses.md#ppo-with-a-critic-gae.

The head is replicated, not sharded: every rank holds all of it, `step` sums its gradient over the ranks
(every rank's backward multiplied its loss share by the world size, as FSDP averages) and every rank takes
the same AdamW step. V_old, the values the advantages are computed with, is a no-grad forward of the policy
and the head before the update epochs (`values`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from prime_rl.batch_format import MicroBatch
from prime_rl.trainer.config import CriticConfig
from prime_rl.trainer.critic import ValueTargets, value_loss
from prime_rl.trainer.model import forward_hidden, from_previous_position, on_model_device
from prime_rl.trainer.optim import build_optimizer, checked_step


class ValueHeadCritic:
    """The value-head critic (a `critic.JointCritic`): the head (`model`, an `nn.Linear(hidden_size, 1)`), its AdamW
    (`optimizer`) and the policy it reads."""

    joint = True

    def __init__(self, config: CriticConfig, policy: nn.Module, device: torch.device, seed: int):
        self.config = config
        self.coef = config.value_loss_coef
        self.policy = policy
        with torch.random.fork_rng(devices=[]):  # the same head on every rank and run
            torch.manual_seed(seed)
            self.model = nn.Linear(policy.config.hidden_size, 1, dtype=torch.float32)
            nn.init.normal_(self.model.weight, std=getattr(policy.config, "initializer_range", 0.02))
            nn.init.zeros_(self.model.bias)
        self.model.to(device)
        self.optimizer = build_optimizer(self.model, config.optim)

    def values_of(self, hidden: torch.Tensor, sample_lens: torch.Tensor) -> torch.Tensor:
        """V [T] float32 of a packed row from its final hidden states [T, H] (module docstring)."""
        return from_previous_position(self.model(hidden.float())[:, 0], sample_lens)

    def joint_loss(self, hidden: torch.Tensor, mb: MicroBatch, old: torch.Tensor, target: torch.Tensor,
                   count: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """c_V * L_V's share of one micro-batch from the policy forward's `hidden` states (module docstring)."""
        share, pairs = value_loss(self.values_of(hidden, mb.sample_lens), old, target, mb.loss_mask, count,
                                  self.config.value_clip)
        return self.coef * share, pairs

    def values(self, mb: MicroBatch) -> torch.Tensor:
        """V [T] of a packed row: a forward of the policy and the head (call under `torch.no_grad()` for V_old)."""
        rows = on_model_device(self.policy, [(mb.input_ids, mb.position_ids, mb.sample_lens)])
        (hidden,) = forward_hidden(self.policy, rows)
        return self.values_of(hidden, mb.sample_lens)

    def train_epoch(self, batch: list[MicroBatch], targets: ValueTargets, step: int,
                    policy_loss: float) -> dict[str, float]:
        """The head's step after the epoch's joint backward (its loss was in it): `value/grad_norm`."""
        return {"value/grad_norm": self.step(step, policy_loss)}

    def step(self, step: int, loss_value: float) -> float:
        """Collective, after the update epoch's joint backward: sum the head's gradient over ranks, divide it by
        world size * c_V (giving grad_w L_V of the step), clip, AdamW; returns the norm before clipping.
        `loss_value`: the epoch's (all-reduced) joint loss, for the finite check."""
        scale = dist.get_world_size() * self.coef
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)
            param.grad.div_(scale)
        return checked_step(self.model, self.optimizer, self.config.optim.max_norm, loss_value,
                            f"value head step {step}")

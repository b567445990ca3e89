"""A custom prime-rl policy loss: REINFORCE with a capped, stop-gradient importance weight."""

import torch

from prime_rl.trainer.rl.losses import LossInputs


def capped_reinforce(inputs: LossInputs, max_weight: float = 2.0) -> torch.Tensor:
    """Per-token loss -sg(min(r, max_weight)) * A * lp; prime-rl masks and normalizes it."""
    # Off the mask (prompt tokens) the logprobs may be NaN: keep them out of the weight.
    log_ratio = torch.where(inputs.loss_mask, inputs.trainer_logprobs - inputs.inference_logprobs, 0.0)
    weight = log_ratio.exp().clamp(max=max_weight).detach()
    return -weight * inputs.advantages * inputs.trainer_logprobs

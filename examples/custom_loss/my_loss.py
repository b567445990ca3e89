"""A custom prime-rl policy loss: REINFORCE with a capped, stop-gradient importance weight."""

import torch

from prime_rl.trainer.rl.loss import LossInputs


def capped_reinforce(inputs: LossInputs, max_weight: float = 2.0) -> torch.Tensor:
    """Per-token loss -sg(min(r, max_weight)) * A * lp; prime-rl masks and normalizes it."""
    ratio = torch.exp(inputs.trainer_logprobs - inputs.inference_logprobs).detach()
    return -ratio.clamp(max=max_weight) * inputs.advantages * inputs.trainer_logprobs

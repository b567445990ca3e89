"""pi_old of the surrogate, decided in one place: the loss says what it reads (`Loss.needs_old_logprobs`:
`[loss.correction] old_logprobs = "trainer"`, decoupled PPO's third policy), this module says how the trainer makes it.

- The loss reads no old policy of the trainer's (`old_logprobs = "sampler"` or `"current"`): lo is None.
- One update epoch: the step's first (and only) pass runs the weights before the update, so lo = sg(lp) of that
  same pass; no forward is spent.
- `update_epochs > 1`: a no-grad forward of every micro-batch before the first update (without entropies), kept for
  every pass of the step (its cost: docs/benchmarks.md#the-old-policy-forward).
"""

from __future__ import annotations

import torch

from prime_rl.batch_format import RankBatch
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.trainer.model import score_rows


class OldPolicy:
    """The old policy's logprobs lo of each micro-batch of a step, as the loss asks for them."""

    def __init__(self, wanted: bool, update_epochs: int):
        self.wanted = wanted
        self.needs_forward = wanted and update_epochs > 1
        self._saved: list[torch.Tensor] | None = None

    def before_step(self, model: torch.nn.Module, batch: RankBatch, rule: SamplingRule) -> None:
        """Run the forward the step needs before its first update (only with several update epochs)."""
        self._saved = None
        if self.needs_forward:
            with torch.no_grad():
                self._saved = [score_rows(model, [(mb.input_ids, mb.position_ids, mb.sample_lens)], rule,
                                          entropies=False, wanted=[mb.scored_tokens])[0][0][0]
                               for mb in batch.micro_batches]

    def known(self, i: int) -> torch.Tensor | None:
        """lo of micro-batch i when it exists before any pass (the forward's), else None."""
        return None if self._saved is None else self._saved[i]

    def of(self, i: int, lp: torch.Tensor) -> torch.Tensor | None:
        """lo of micro-batch i in a pass whose logprobs are `lp`: the forward's, sg(lp) with one epoch, or None
        where the loss reads none."""
        if self._saved is not None:
            return self._saved[i]
        return lp.detach() if self.wanted else None

"""How the builtin engine serves LoRA adapters: merged into a copy of the base weights.

An adapter update sets every weight it targets to W = W0 + scale * B @ A (computed in float32,
then cast to the served dtype), every weight it saves in full (`modules_to_save`) to the saved
value, and every weight an earlier adapter changed but this one does not back to W0: adapters
replace each other, they never stack. W0 is kept for exactly the weights some adapter has
changed since the last full-weights update, which makes those weights the new base. Decoding
then runs the plain model, as fast as without LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Staged:
    """A checked update ready to apply: new values per parameter name (full weights), or for an `adapter`
    float32 deltas scale * B @ A per weight name (`tensors`) and the values of its saved weights (`saved`)."""

    tensors: dict[str, torch.Tensor]
    adapter: bool = False
    saved: dict[str, torch.Tensor] = field(default_factory=dict)


class BaseWeights:
    """The base values W0 of the weights adapters have changed (the caller holds the model still)."""

    def __init__(self):
        self.saved: dict[str, torch.Tensor] = {}

    def served(self, params: dict[str, torch.Tensor], staged: Staged) -> dict[str, torch.Tensor]:
        """The values `apply` would write for `staged`'s tensors (in the served dtype), to check before applying."""
        if not staged.adapter:
            return staged.tensors
        merged = {name: (self.saved.get(name, params[name]).to(delta.dtype) + delta).to(params[name].dtype)
                  for name, delta in staged.tensors.items()}
        return merged | staged.saved

    def apply(self, params: dict[str, torch.Tensor], staged: Staged) -> None:
        """Write `staged` into `params` (the model's state dict) in place."""
        if not staged.adapter:
            self.saved.clear()  # the new full weights are the base
            for name, tensor in staged.tensors.items():
                params[name].copy_(tensor)
            return
        for name in self.saved.keys() - staged.tensors.keys() - staged.saved.keys():
            params[name].copy_(self.saved.pop(name))
        for name, delta in staged.tensors.items():
            base = self.saved.setdefault(name, params[name].clone())
            params[name].copy_(base.to(delta.dtype) + delta)
        for name, value in staged.saved.items():
            self.saved.setdefault(name, params[name].clone())
            params[name].copy_(value)

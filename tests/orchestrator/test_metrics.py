"""Per-step orchestrator metrics (`orchestrator/metrics.py`)."""

from __future__ import annotations

import torch

from prime_rl.orchestrator.metrics import pass_at_k


def test_pass_at_k_is_the_fraction_of_examples_with_a_solved_rollout():
    solved = torch.tensor([[True, False], [False, False], [False, True], [False, False]])
    assert pass_at_k(solved) == 0.5
    assert pass_at_k(torch.zeros(0, 2, dtype=torch.bool)) == 0.0

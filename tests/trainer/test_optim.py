"""Learning-rate schedule shapes (pure functions of the step)."""

from __future__ import annotations

import math

import pytest
import torch

from prime_rl.trainer.config import OptimConfig, SchedulerConfig
from prime_rl.trainer.optim import build_optimizer, build_scheduler, lr_factor


def factors(config: SchedulerConfig, max_steps: int) -> list[float]:
    return [lr_factor(step, config, max_steps) for step in range(max_steps)]


def test_constant_with_warmup():
    f = factors(SchedulerConfig(type="constant", warmup_steps=4), 10)
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert f[4:] == [1.0] * 6


def test_linear_decays_to_min_ratio_at_last_step():
    f = factors(SchedulerConfig(type="linear", warmup_steps=2, min_lr_ratio=0.1), 12)
    assert f[:2] == pytest.approx([0.5, 1.0])
    assert f[2] == pytest.approx(1.0)
    assert f[-1] == pytest.approx(0.1)
    steps = [b - a for a, b in zip(f[2:], f[3:], strict=False)]
    assert all(s == pytest.approx(steps[0]) for s in steps)  # straight line
    assert steps[0] < 0


def test_cosine_shape():
    f = factors(SchedulerConfig(type="cosine", min_lr_ratio=0.0), 11)
    assert f[0] == pytest.approx(1.0)
    assert f[5] == pytest.approx(0.5)  # half-way: (1 + cos(pi/2)) / 2
    assert f[-1] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(f, f[1:], strict=False))
    assert f[2] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))


def test_scheduler_drives_optimizer_lr():
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1))
    scheduler = build_scheduler(optimizer, SchedulerConfig(type="linear", warmup_steps=1), max_steps=3)
    seen = []
    for _ in range(3):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.1, 0.0])

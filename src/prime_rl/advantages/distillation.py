"""The teacher's term: the on-policy distillation (OPD) advantage, computed in the orchestrator from the teacher's
logprobs of every trained sample (`orchestrator/teacher_scoring.py` scores them on the teacher's server).

Per trained token, the sample's task advantage weighted by `task_coef` plus `opd_coef` times the teacher's logprob
minus the sampler's, less the baseline b (0, or with `opd_center` the step's mean gap, `teacher_gap_mean`): slime's
on-policy distillation, a dense reverse-KL reward. Why the sampler's logprob and not the trainer's, why the baseline
leaves the expected gradient unchanged, and the formula: docs/losses.md#on-policy-distillation. Computed once per
sample, so every loss variant trains on it unchanged (`loss.teacher_tau` is the trainer-side alternative).
"""

from __future__ import annotations


def opd_advantages(advantage: float, inference_logprobs: list[float], teacher_logprobs: list[float],
                   trained: list[bool], opd_coef: float, task_coef: float, baseline: float = 0.0) -> list[float]:
    """The OPD advantage of each completion token of one sample (module docstring) where trained, else 0."""
    return [task_coef * advantage + opd_coef * (lt - lq - baseline) if t else 0.0
            for lq, lt, t in zip(inference_logprobs, teacher_logprobs, trained, strict=True)]


def teacher_gap_mean(teacher_logprobs: list[list[float]], inference_logprobs: list[list[float]],
                     trained: list[list[bool]]) -> float:
    """The mean of lt - lq over the trained tokens of every sample (one list per sample); 0 without any: the
    baseline b with `opd_center`."""
    gaps = [lt - lq for teacher, sampled, mask in zip(teacher_logprobs, inference_logprobs, trained, strict=True)
            for lt, lq, t in zip(teacher, sampled, mask, strict=True) if t]
    return sum(gaps) / max(len(gaps), 1)

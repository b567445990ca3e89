"""The teacher's term: the on-policy distillation (OPD) advantage, computed in the orchestrator from the teacher's
logprobs of every trained sample (`orchestrator/teacher_scoring.py` scores them on the teacher's server).

With lt_t = log softmax(z_teacher(x_<t) / T)[x_t], the teacher's logprob of token t (T: `teacher.temperature`,
by default the sampling temperature), lq_t the sampler's and A the sample's task advantage, per trained token
(slime's on-policy distillation; the reverse-KL reward of Thinking Machines' on-policy distillation):

    A_t = task_coef * A + opd_coef * (lt_t - lq_t - b)

b = 0, or with `opd_center` the mean of lt - lq over the step's trained tokens (`teacher_gap_mean`: a constant
baseline, as Tinker's distillation subtracts: it does not change the expected gradient, since
E[grad log pi] = 0, but removes the push-down every sampled token gets from a negative mean). lq_t - lt_t is
the one-sample (k1) estimate of the reverse KL, KL(pi_sampler || pi_teacher), at that state: the OPD term is
`-opd_coef * reverse KL`, a dense per-token reward that pushes the student towards the teacher's modes on the
states the student visits itself. lq, not the trainer's lp: a token's reward is fixed when it is sampled (slime
uses the "old" student logprobs too), and every loss's importance ratio corrects for the policy having moved
since; on-policy they are equal. Computed once per sample, so every loss variant trains on it unchanged
(`loss.teacher_tau` is the trainer-side alternative, on the current lp: the loss's shaped advantage).
"""

from __future__ import annotations


def opd_advantages(advantage: float, inference_logprobs: list[float], teacher_logprobs: list[float],
                   trained: list[bool], opd_coef: float, task_coef: float, baseline: float = 0.0) -> list[float]:
    """Per completion token: task_coef * A + opd_coef * (lt - lq - baseline) where trained, else 0."""
    return [task_coef * advantage + opd_coef * (lt - lq - baseline) if t else 0.0
            for lq, lt, t in zip(inference_logprobs, teacher_logprobs, trained, strict=True)]


def teacher_gap_mean(teacher_logprobs: list[list[float]], inference_logprobs: list[list[float]],
                     trained: list[list[bool]]) -> float:
    """The mean of lt - lq over the trained tokens of every sample (one list per sample); 0 without any: the
    baseline b with `opd_center`."""
    gaps = [lt - lq for teacher, sampled, mask in zip(teacher_logprobs, inference_logprobs, trained, strict=True)
            for lt, lq, t in zip(teacher, sampled, mask, strict=True) if t]
    return sum(gaps) / max(len(gaps), 1)

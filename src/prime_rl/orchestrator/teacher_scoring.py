"""On-policy distillation (OPD): the teacher's logprobs of every trained sample, and its OPD advantage.

The teacher is a second model behind an inference server (`[teacher]`, `TeacherConfig`). For
every sample that trains, the orchestrator sends the sample's token ids (prompt + completion,
exactly the ids the trainer gets) to the teacher's `/v1/completions` with `prompt_logprobs: 0`
at temperature T (`teacher.temperature`, by default the sampling temperature), several samples
per request (`teacher.samples_per_request`, `InferenceClient.score_many`: the server prefills
them together), and gets for every token after the first

    lt_t = log softmax(z_teacher(x_<t) / T)[x_t]        (no top-k/top-p/min-p truncation)

A T below the sampling temperature distils towards a sharper teacher than the one that would
sample at the student's temperature.

Of these the sample keeps its trained tokens, the ones the policy sampled: a multi-turn
sample's environment tokens get no teacher term (0 in the batch, as off the loss mask). They become
the sample's `teacher_logprobs` and its per-token OPD advantage (the math: `prime_rl.advantages.distillation`).

Edges: a sample that does not fit the teacher's context (with the one token a scoring request
generates) cannot be scored; it trains no token (a warning, `rollout/teacher_skipped_frac`). A
teacher that fails, cannot be reached, or answers malformed or non-finite logprobs ends the run
(InferenceError, exit 1): training on a broken teacher's signal would be silent damage.
"""

from __future__ import annotations

import asyncio
import time

from prime_rl.advantages.distillation import opd_advantages, teacher_gap_mean
from prime_rl.orchestrator.batch import Sample
from prime_rl.orchestrator.client import InferenceClient, InferenceError
from prime_rl.orchestrator.config import ClientConfig, TeacherConfig
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")


class Teacher:
    """The teacher server's client; `async with Teacher(config, client_config) as teacher`."""

    def __init__(self, config: TeacherConfig, client: ClientConfig):
        self.config = config
        if config.base_url is None:
            raise InferenceError("teacher.base_url is not set (rl sets it for the teacher server it starts)")
        self.client = InferenceClient(client.model_copy(update={"base_url": config.base_url,
                                                                "api_key": config.api_key}))

    async def __aenter__(self) -> Teacher:
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.__aexit__(*exc)

    async def wait_ready(self) -> str:
        """The teacher's model id (and its context, when the server states one), once it answers."""
        try:
            return await self.client.wait_ready()
        except InferenceError as exc:
            raise InferenceError(f"teacher: {exc}") from None

    async def apply(self, samples: list[Sample], temperature: float) -> dict[str, float]:
        """Score every sample that trains (`samples_per_request` per request, the requests concurrently, at most the
        client's max_concurrency of them), set its
        `teacher_logprobs` and OPD `token_advantages`; a sample the teacher's context cannot hold stops training.
        Returns the step's teacher metrics."""
        start = time.monotonic()
        limit = self.client.context_len
        training = [s for s in samples if any(s.trained())]
        too_long = [s for s in training if limit is not None and len(s) + 1 > limit]
        for s in too_long:
            s.train = False
        scored = [s for s in training if s.train]
        size = self.config.samples_per_request
        chunks = [[s.prompt_ids + s.completion_ids for s in scored[i:i + size]] for i in range(0, len(scored), size)]
        try:
            answers = await asyncio.gather(*(self.client.score_many(chunk, temperature) for chunk in chunks))
        except InferenceError as exc:
            raise InferenceError(f"teacher: {exc}") from None
        results = [logprobs for answer in answers for logprobs in answer]
        teachers = [logprobs[len(s.prompt_ids) - 1:] for s, logprobs in zip(scored, results, strict=True)]
        mean = teacher_gap_mean(teachers, [s.completion_logprobs for s in scored], [s.trained() for s in scored])
        baseline = mean if self.config.opd_center else 0.0
        for s, teacher in zip(scored, teachers, strict=True):  # teacher[j]: logprobs[i] scores token i + 1
            trained = s.trained()
            s.teacher_logprobs = [lt if t else 0.0 for lt, t in zip(teacher, trained, strict=True)]
            s.token_advantages = opd_advantages(s.advantage, s.completion_logprobs, teacher, trained,
                                                self.config.opd_coef, self.config.task_coef, baseline)
        if too_long:
            log.warning(f"{len(too_long)} sample(s) longer than the teacher's context of {limit} tokens (minus the one "
                        "a scoring request generates) train no token")
        return {
            "perf/teacher_s": time.monotonic() - start,
            "rollout/teacher_skipped_frac": len(too_long) / max(len(training), 1),
            "advantage/opd_mean": self.config.opd_coef * mean,
        }

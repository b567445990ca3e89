"""`orchestrator` entrypoint: the async rollout loop.

    orchestrator @ orchestrator.toml [--key value ...]
    python -m prime_rl.orchestrator.orchestrator @ orchestrator.toml

For n in start .. max_steps - 1:
  1. the step's `RolloutCollector` (`collector.py`, chosen by `rollout_mode`) prepares it: the server must
     serve weights m >= n - max_async_level (wait for the trainer's `weights/step_m/`, POST
     /update_weights; step 0's weights are the initial model); in continuous mode only before an evaluation,
     since its requests load weights in flight as they go;
  2. every `eval.interval` steps, evaluate on a fixed example set;
  3. the collector's groups: batch_size / rollouts_per_example examples with rollouts_per_example scored
     completions each (step mode: drawn and generated now, `step_collector.py`; continuous: the groups that
     finish, `continuous_collector.py`), zero-advantage groups dropped if asked (dynamic sampling draws more,
     up to a cap); then the advantages (those of a type computed here, `group_advantages.py`; 0 and the
     rewards for one the trainer computes); with a teacher, score every trained sample on the teacher's
     server and turn its advantage into the per-token OPD advantage (`teacher_scoring.py`);
  4. pack and write `rollouts/step_n/` (atomically), log metrics, checkpoint.
Writing step n and moving on to n + 1 is what overlaps generation with the trainer's step n. Steps 1-2
and the collection of 3 are `generate`; the rest (advantages, the teacher's scoring, packing, writing) is
`finish`, which `run_steps` runs while step n + 1 generates: the teacher's scoring of step n then costs
no generation time. Steps finish in order, and a failure of either side ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from prime_rl.batch_format import RECORD_FIELDS, write_step
from prime_rl.configs.base import config_data
from prime_rl.configs.cli import run_main
from prime_rl.envs import Environment
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.monitor import Monitor
from prime_rl.orchestrator.batch import Sample, pack_batch
from prime_rl.orchestrator.client import InferenceClient
from prime_rl.orchestrator.collector import Collaborators, RolloutCollector
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.continuous_collector import ContinuousCollector
from prime_rl.orchestrator.examples.draws import Draw, ExampleSource
from prime_rl.orchestrator.group_advantages import GroupAdvantages
from prime_rl.orchestrator.metrics import advantage_metrics, eval_metrics, reward_metrics, rollout_metrics
from prime_rl.orchestrator.orchestrator_ckpt import (
    OrchestratorState,
    load_state,
    rng_from_json,
    rng_to_json,
    save_state,
)
from prime_rl.orchestrator.rollouts.generator import GroupGenerator, request_seed
from prime_rl.orchestrator.rollouts.kinds import build_runners
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.orchestrator.rollouts.seam import RolloutSettings, RunnerContext
from prime_rl.orchestrator.samples_log import samples_jsonl
from prime_rl.orchestrator.servers import ServerPool
from prime_rl.orchestrator.step_collector import StepCollector
from prime_rl.orchestrator.teacher_scoring import Teacher
from prime_rl.orchestrator.weight_sync import WeightSync
from prime_rl.run_dir import log_file, resolve_resume_step, rollouts_root
from prime_rl.samples_summary import COLUMNS, summary_rows
from prime_rl.utils.fs import remove_steps_from
from prime_rl.utils.logging import get_logger, setup_logging
from prime_rl.utils.start_gate import wait_at_start_gate

EVAL_SEED_OFFSET = 1_000_003  # eval examples come from a different stream than training ones
CONSOLE_KEYS = ("reward/mean", "advantage/std", "rollout/filtered_frac", "async/policy_lag_mean", "perf/step_time_s")
COLLECTORS: dict[str, Callable[[Collaborators, OrchestratorConfig], RolloutCollector]] = {
    "step": StepCollector, "continuous": ContinuousCollector}  # by rollout_mode

log = get_logger("orchestrator")


@dataclass
class Generated:
    """One step's rollouts before `Orchestrator.finish`: what it needs, captured when generation ended (the next
    step's generation changes the orchestrator's counters and draws more examples meanwhile)."""

    step: int
    start: float  # time.monotonic() at the step's start
    groups: list[Group]  # every group generated
    kept: list[Group]  # the groups that train
    metrics: dict[str, float]  # of weight sync, eval and generation
    state: OrchestratorState  # the checkpoint of a run resuming after this step


def eval_draws(config: OrchestratorConfig, envs: dict[str, Environment]) -> list[Draw]:
    """The fixed evaluation set: the first `eval.num_examples` eval examples of every environment (`envs`: the
    run's, by metric name)."""
    draws = []
    for i, env_config in enumerate(config.env):
        env = envs[env_config.metric_name]
        examples = env.eval_examples(seed=config.seed + EVAL_SEED_OFFSET + i)
        draws += [Draw(env_config.metric_name, env, next(examples), env_config)
                  for _ in range(config.eval.num_examples)]
    return draws


def group_generator(config: OrchestratorConfig, envs: dict[str, Environment], client: InferenceClient | ServerPool
                    ) -> GroupGenerator:
    """The run's rollout generator (`rollouts_per_example` completions a prompt, `sampling`'s rule) with one runner
    for each rollout kind of `envs` (`rollouts/kinds.py`); the caller stops it."""
    context = RunnerContext(config, client)
    runners = build_runners((env.rollout_kind for env in envs.values()), context)
    # Sampled ids past the tokenizer's fail their rollout (`rollouts/scoring.cut_unsampleable`).
    settings = RolloutSettings(config.sampling.max_tokens, config.truncated_reward, context.vocab(),
                               config.chat_template_kwargs, config.reasoning)
    return GroupGenerator(runners, config.rollouts_per_example, config.sampling.rule, settings)


def eval_generator(generator: GroupGenerator, rollouts: int, temperature: float) -> GroupGenerator:
    """`generator` for evaluation: `rollouts` completions a prompt at `temperature` (0: greedy), a truncated
    completion scored as it is (never trained on, so no truncation penalty)."""
    return replace(generator, n=rollouts, rule=SamplingRule(temperature),
                   settings=replace(generator.settings, truncated_reward=None))


async def generate_eval(generator: GroupGenerator, draws: list[Draw], seed: int) -> list[Group]:
    """The groups of the fixed evaluation set `draws`, each request with its own seed from `seed` (the same
    every time, so a model's evaluation repeats)."""
    seeds = [request_seed(seed + EVAL_SEED_OFFSET, 0, i) for i in range(len(draws))]
    return await generator.generate(draws, seeds)


class Orchestrator:
    """One run's loop: composes the collaborators (the example draws, the weight sync, the group generator, the
    advantages, the `RolloutCollector` of `rollout_mode`), evaluates, and turns each step's collected groups into
    its batch file and metrics (`finish`). The collector gets the collaborators it needs; nothing reaches back in
    here."""

    def __init__(self, config: OrchestratorConfig, client: InferenceClient | ServerPool, state: OrchestratorState,
                 teacher: Teacher | None = None):
        self.config = config
        self.client = client
        self.teacher = teacher
        self.tables: dict[int, list[list]] = {}
        """Rows of the W&B samples tables of finished steps not yet logged (`[orchestrator.samples] wandb_interval`)."""
        rng = rng_from_json(state.rng_state) if state.rng_state is not None else None
        self.source = ExampleSource(config.env, config.seed, state.env_cursors, rng, config.curriculum,
                                    state.curriculum)
        self.sync = WeightSync(client, config.output_dir, config.max_async_level, config.weights_timeout_s,
                               trusted_upto=state.step, in_flight=config.rollout_mode == "continuous")
        self.generator = generator = group_generator(config, self.source.envs, client)
        self.advantages = GroupAdvantages(config.advantage, config.rollouts_per_example)
        parts = Collaborators(generator, self.source, self.sync, self.advantages)
        self.collector: RolloutCollector = COLLECTORS[config.rollout_mode](parts, config)
        e = config.eval
        self.eval_generator = eval_generator(generator, e.rollouts, e.temperature)
        self.eval_draws = eval_draws(config, self.source.envs) if e.interval else []

    async def evaluate(self, step: int) -> dict[str, float]:
        start = time.perf_counter()
        groups = await generate_eval(self.eval_generator, self.eval_draws, self.config.seed)
        metrics = eval_metrics(groups, self.config.eval.success_threshold)
        metrics["perf/eval_s"] = time.perf_counter() - start
        log.info(f"step {step} eval: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()))
        return metrics

    def samples(self, groups: list[Group], advantages: torch.Tensor,
                keys: dict[tuple[int, int, int], int] | None = None) -> list[Sample]:
        """Every trained sample of `groups`: one per rollout that trains (an agent rollout: one per segment, each
        with the rollout's advantage and reward, per token discounted by its call with a `turn_discount`), keyed as the
        step's samples file keys them (`SamplesFile.keys`; -1: not in the file)."""
        samples, keys = [], keys or {}
        for index, (group, row) in enumerate(zip(groups, advantages.tolist(), strict=True)):
            for rollout, (advantage, reward) in enumerate(zip(row, group.rewards, strict=True)):
                if not group.trains(rollout):  # a failed rollout of a partial group
                    continue
                for segment, piece in enumerate(group.trained(rollout)):
                    completion = piece.completion
                    train = not (self.config.mask_truncated and completion.truncated)
                    sample = Sample(piece.prompt_ids, completion.token_ids, completion.logprobs, advantage,
                                    group.result.policy_step(completion), train, completion.mask, reward=reward,
                                    group=index, key=keys.get((id(group), rollout, segment), -1))
                    if piece.scales is not None:
                        sample.token_advantages = [advantage * scale for scale in piece.scales]
                    if len(sample) > self.config.seq_len:
                        log.warning(f"a rollout of {len(sample)} tokens is cut to seq_len {self.config.seq_len}")
                        sample = sample.truncate(self.config.seq_len)
                    samples.append(sample)
        return samples

    async def close(self) -> None:
        """Stop the collector's rollouts in flight and the rollout runners (an agent gateway)."""
        try:
            await self.collector.stop()
        finally:
            await self.generator.stop()

    async def step(self, step: int) -> dict[str, float]:
        """Generate step `step`, then finish it (`run_steps` overlaps the two parts of consecutive steps)."""
        return await self.finish(await self.generate(step))

    async def generate(self, step: int) -> Generated:
        """Steps 1-3 of the module docstring up to the rollouts: weights, eval, the collector's groups (which update
        the curriculum's pass rates, when there is one)."""
        c = self.config
        start = time.monotonic()
        evaluating = bool(c.eval.interval) and step % c.eval.interval == 0
        await self.collector.prepare(step, evaluating)
        metrics = await self.evaluate(step) if evaluating else {}
        collected = await self.collector.collect(step)
        metrics |= collected.metrics
        if isinstance(self.client, ServerPool) and len(self.client.clients) > 1:  # before the next step's requests
            metrics |= self.client.step_metrics()
        curriculum = self.source.curriculum
        if curriculum is not None:  # before the snapshot: a run resumed from it weighs the examples as this one
            curriculum.observe(collected.groups + collected.stale)  # a stale group was scored all the same
            metrics |= curriculum.metrics()
        state = OrchestratorState(step + 1, dict(self.source.cursors), rng_to_json(self.source.rng),
                                  curriculum.state() if curriculum is not None else None)
        return Generated(step, start, collected.groups, collected.kept, metrics, state)

    async def finish(self, generated: Generated) -> dict[str, float]:
        """Steps 3-4 of the module docstring after generation: advantages, the teacher's scoring, the batch
        written; returns the step's metrics."""
        c = self.config
        step, groups, kept, metrics = generated.step, generated.groups, generated.kept, dict(generated.metrics)
        advantages = self.advantages.of(kept, c.normalize_advantages)
        if not kept:
            log.warning(f"step {step}: every group was filtered out; the trainer gets an empty (all-masked) batch")
        no_signal = bool(kept) and self.teacher is None and c.advantage.trainer_step is None and not advantages.any()
        if no_signal:
            log.warning(f"step {step}: every advantage is 0 (each group's rewards are equal): the step carries no "
                        "learning signal and its policy loss is 0")
        written = samples_jsonl(c.samples, step, groups, kept, advantages)
        samples = self.samples(kept, advantages, written.keys if written is not None else None)
        if self.teacher is not None:  # teacher logprobs and the OPD advantage (advantages/distillation.py)
            metrics |= await self.teacher.apply(samples, c.teacher_temperature)
        optional = (("teacher_logprobs",) if self.teacher is not None else ()) + c.advantage.batch_fields
        optional += RECORD_FIELDS if written is not None else ()
        batches = pack_batch(samples, c.seq_len, c.trainer_world_size, step, c.sampling.rule, c.sampling.max_tokens,
                             c.share_prompts, optional, c.advantage.type)
        write_step(c.output_dir, step, batches, written.data if written is not None else None)
        if written is not None and c.samples.wandb_interval and step % c.samples.wandb_interval == 0:
            self.tables[step] = summary_rows(written.data.splitlines(), c.samples.wandb_rows)
        total = sum(len(g.rewards) for g in groups)
        metrics |= reward_metrics(groups) | rollout_metrics(groups, step)
        metrics |= advantage_metrics(advantages, self.advantages.trained(kept))
        metrics |= {
            "rollout/filtered_frac": 1 - sum(len(g.rewards) for g in kept) / total,
            "rollout/unusable_groups": float(sum(not self.advantages.usable(g) for g in groups)),
            "rollout/num_samples": float(len(samples)),
            "advantage/no_signal": float(no_signal),
            "rollout/micro_batches_per_rank": float(len(batches[0].micro_batches)),
            "perf/step_time_s": time.monotonic() - generated.start,
        }
        return metrics

    def checkpoint(self, state: OrchestratorState) -> None:
        """Save `state` (a `Generated.state`: where a resumed run starts drawing)."""
        # Retention counts complete (trainer + orchestrator) steps: the parts this process writes ahead
        # of the trainer are kept until their partner arrives (run_dir.prune_checkpoints).
        save_state(self.config.output_dir, state, self.config.ckpt.keep)


async def run_steps(orch: Orchestrator, monitor: Monitor, first: int) -> None:
    """Steps `first` .. max_steps - 1, step n's `finish` (then its log line and checkpoint) running while step
    n + 1 generates. Finishes run one at a time, in step order; the first error of either side cancels the
    other and is raised as itself."""
    config = orch.config
    interval = config.ckpt.interval

    async def complete(generated: Generated) -> None:
        metrics = await orch.finish(generated)
        monitor.log(metrics, generated.step)
        if generated.step in orch.tables:
            monitor.table("samples", COLUMNS, orch.tables.pop(generated.step), generated.step)
        log.info(
            f"step {generated.step}: reward {metrics['reward/mean']:.3f}, lag {metrics['async/policy_lag_mean']:.2f}, "
            f"{metrics['perf/step_time_s']:.2f}s (waited {metrics['perf/wait_for_weights_s']:.2f}s for weights)"
        )
        done = generated.step + 1
        if (interval and done % interval == 0) or done == config.max_steps:
            orch.checkpoint(generated.state)

    try:
        async with asyncio.TaskGroup() as tasks:
            finishing = None
            for step in range(first, config.max_steps):
                if finishing is not None and config.max_async_level == 0:
                    await finishing  # step n + 1 needs the weights trained on batch n: nothing to overlap
                generated = await orch.generate(step)
                if finishing is not None:
                    await finishing
                finishing = tasks.create_task(complete(generated))
    except ExceptionGroup as group:  # the task group wraps the first failure
        raise group.exceptions[0] from None


async def run(config: OrchestratorConfig) -> None:
    resume = resolve_resume_step(config.output_dir, config.ckpt.resume_step)
    state = load_state(config.output_dir, resume) if resume is not None else OrchestratorState()
    if resume is not None:
        # Batches at or after the resume step came from the previous run.
        remove_steps_from(rollouts_root(config.output_dir), state.step)
        log.info(f"resuming from checkpoint step {resume}")
    monitor = Monitor(config.output_dir, "orchestrator", config.wandb, config_data(config),
                      console_keys=CONSOLE_KEYS, resume_step=resume)
    try:
        async with ServerPool(config.client) as client, contextlib.AsyncExitStack() as stack:
            model = await client.wait_ready()
            log.info(f"inference server(s) {client.root} serve {model}")
            teacher = None
            if config.teacher is not None:
                teacher = await stack.enter_async_context(Teacher(config.teacher, config.client))
                log.info(f"teacher server {teacher.client.root} serves {await teacher.wait_ready()}")
            orch = Orchestrator(config, client, state, teacher)
            await orch.sync.align(config.model.path)
            try:
                await run_steps(orch, monitor, state.step)
            finally:
                await orch.close()
    finally:
        monitor.close()
    log.info(f"done: wrote rollouts for steps {state.step}..{config.max_steps - 1}")


def body(config: OrchestratorConfig) -> None:
    setup_logging("orchestrator", log_file(config.output_dir, "orchestrator"))
    wait_at_start_gate()  # started by rl with the server: imported meanwhile, it goes on once the server answers
    asyncio.run(run(config))


def main(argv: list[str] | None = None) -> None:
    run_main(OrchestratorConfig, body, argv)


if __name__ == "__main__":
    main()

"""Where one RL trainer step's time goes: the real trainer replayed on a finished run's own rollout batches, under
torch's profiler (docs/benchmarks.md, "How close to the CPU's limit").

    uv run python benchmarks/profile_trainer_step.py --run outputs/smollm2 [--first 10 --steps 4 --threads 1]

The run's rollout batches `rollouts/step_{first..first+steps-1}/rank_0.pt` are copied into a scratch output
directory and trained from the run's own base model with its resolved trainer config (`configs/trainer.toml`:
loss, optimizer, packing, threads), nothing else running, twice: plainly (the step times and tokens/s to compare
before and after a change) and under torch's profiler (which slows every operator a little). The first step of
each is a warm-up. Reported per step: the phases (advantages, forward with the output head, loss, backward,
optimizer step), the operators that take the most time by themselves, and the matrix multiplies' share
(`aten::mm`/`addmm`/`bmm`): the ceiling the rest puts on the share of the GEMM peak
(`benchmarks/cpu_utilization.py`) the step can reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import tomllib
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASES = ("advantages", "forward", "loss", "backward", "optimizer")
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def labelled(label: str, fn):
    """`fn` with its calls marked `label` in the profile."""

    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def label_phases() -> None:
    """Mark the trainer's phases (`trainer/rl/train.py`) so the profile can sum them."""
    from prime_rl.trainer.rl import train
    from prime_rl.trainer.session import TrainSession

    train.step_advantages = labelled("advantages", train.step_advantages)
    train.compute_logprobs = labelled("forward", train.compute_logprobs)
    build = train.build_loss
    train.build_loss = lambda config: _labelled_loss(build(config))
    TrainSession.backward = labelled("backward", TrainSession.backward)
    TrainSession.optimizer_step = labelled("optimizer", TrainSession.optimizer_step)


def _labelled_loss(loss):
    call = type(loss).__call__

    class Labelled(type(loss)):
        def __call__(self, *args, **kwargs):
            with record_function("loss"):
                return call(self, *args, **kwargs)

    loss.__class__ = Labelled
    return loss


def copy_batches(run: Path, out: Path, first: int, steps: int) -> None:
    """The run's batches of steps first.. as steps 0.., each sample's policy step moved with them."""
    from prime_rl.batch_format import read_rank, write_step

    for i in range(steps):
        if not (run / "rollouts" / f"step_{first + i}" / "rank_0.pt").exists():
            raise SystemExit(f"{run}/rollouts/step_{first + i}/rank_0.pt missing: a finished run's batches are needed")
        batch = read_rank(run, first + i, 0)
        shift = first + i - batch.step
        micro = [replace(mb, policy_step=(mb.policy_step - first - shift).clamp(min=0)) for mb in batch.micro_batches]
        write_step(out, i, [replace(batch, step=i, micro_batches=micro)])


def trainer_config(run: Path, out: Path, steps: int, threads: int | None):
    from prime_rl.trainer.config import TrainerConfig

    recorded = tomllib.loads((run / "configs" / "trainer.toml").read_text())
    recorded.pop("ckpt", None)
    overrides = {"output_dir": str(out), "max_steps": steps, "keep_weights": 1, "max_async_level": steps,
                 "wandb": {"mode": "disabled"}}
    if threads is not None:
        overrides["runtime"] = recorded.get("runtime", {}) | {"threads": threads}
    return TrainerConfig.build([], recorded | overrides)


def report(prof, steps: int) -> dict:
    """Seconds per profiled step by phase and by operator (self time), and the matrix multiplies' share."""
    events = prof.key_averages()
    per_step = 1e6 * steps
    phases = {e.key: e.cpu_time_total / per_step for e in events if e.key in PHASES}
    ops = defaultdict(float)
    for e in events:
        if e.key.startswith("aten::") or "Backward" in e.key or e.key.startswith("Optimizer"):
            ops[e.key] += e.self_cpu_time_total / per_step
    gemm = sum(v for k, v in ops.items() if k in GEMM_OPS)
    return {"profiled_s": sum(phases.values()), "phases": phases, "gemm_s": gemm,
            "gemm_share": gemm / sum(phases.values()),
            "top_ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:15])}


def replay(args, profiled: bool):
    """Train the copied batches; (trainer metrics rows after the warm-up step, the profiler or None)."""
    from prime_rl.trainer.rl.train import train
    from prime_rl.trainer.session import TrainSession

    with tempfile.TemporaryDirectory(prefix="profile-trainer-") as tmp:
        out = Path(tmp)
        copy_batches(args.run, out, args.first, args.steps)
        config = trainer_config(args.run, out, args.steps, args.threads)
        prof = None
        if profiled:
            schedule = torch.profiler.schedule(wait=0, warmup=1, active=args.steps - 1, repeat=1)
            after = TrainSession.after_step
            with profile(activities=[ProfilerActivity.CPU], schedule=schedule) as prof:
                def stepping(self, *a, **kw):
                    after(self, *a, **kw)
                    prof.step()

                TrainSession.after_step = stepping
                try:
                    train(config)
                finally:
                    TrainSession.after_step = after
        else:
            train(config)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("source") == "trainer"][1:], prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished rl run's output_dir")
    parser.add_argument("--first", type=int, default=10, help="the first of the run's steps to replay")
    parser.add_argument("--steps", type=int, default=4, help="steps to replay (the first is a warm-up)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the run's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.steps < 2:
        raise SystemExit("--steps must be >= 2: the first step is a warm-up")
    label_phases()
    rows, _ = replay(args, profiled=False)
    times = [r["perf/step_time_s"] for r in rows]
    figures = {"step_s": statistics.fmean(times), "step_times_s": times,
               "tokens_per_step": statistics.fmean(r["perf/tokens_per_s"] * r["perf/step_time_s"] for r in rows),
               "threads": torch.get_num_threads()}
    figures["tokens_per_s"] = figures["tokens_per_step"] / figures["step_s"]
    _, prof = replay(args, profiled=True)
    figures |= report(prof, args.steps - 1)
    print(f"step {figures['step_s']:.2f} s, {figures['tokens_per_s']:.1f} tokens/s (mean of {args.steps - 1} "
          f"unprofiled steps: {', '.join(f'{t:.2f}' for t in times)} s; {figures['tokens_per_step']:.0f} tokens, "
          f"{figures['threads']} thread(s))")
    print(f"under the profiler, {figures['profiled_s']:.2f} s per step:")
    for name in PHASES:
        seconds = figures["phases"].get(name, 0.0)
        print(f"  {name:<12} {seconds:7.3f} s  {seconds / figures['profiled_s']:4.0%}")
    print(f"matrix multiplies (self): {figures['gemm_s']:.3f} s = {figures['gemm_share']:.0%} of it")
    print("operators by self time per step:")
    for name, seconds in figures["top_ops"].items():
        print(f"  {seconds:7.3f} s  {name}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

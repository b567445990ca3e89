"""What writing a step's samples costs, per step of the reverse-text example's shape (`--groups` prompts x
`--per-group` completions of `--tokens` tokens, prompts of 27): the orchestrator's `samples_jsonl` (every rollout
as a JSON line, with its tokens) and the trainer's token outcomes (`Loss(..., outcomes=True)` and
`micro_batch_outcomes` over the step's packed rows), against the example's ~0.75-1.2 s step.

    uv run python benchmarks/samples_cost.py [--groups 64] [--per-group 8] [--tokens 10] [--repeats 20]

For the whole run, compare `benchmarks/time_to_reward.py` with and without `-- --orchestrator.samples.interval 0`
back to back (docs/benchmarks.md#writing-samples).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from prime_rl.batch_format import RECORD_FIELDS  # noqa: E402
from prime_rl.envs.environment import Example, Rollout  # noqa: E402
from prime_rl.models.sampling_rule import SamplingRule  # noqa: E402
from prime_rl.orchestrator.batch import Sample, pack_batch  # noqa: E402
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion  # noqa: E402
from prime_rl.orchestrator.config import SamplesConfig  # noqa: E402
from prime_rl.orchestrator.rollouts.scored_group import Group  # noqa: E402
from prime_rl.orchestrator.samples_log import samples_jsonl  # noqa: E402
from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale
from prime_rl.trainer.rl.token_outcomes import micro_batch_outcomes  # noqa: E402


def step_groups(groups: int, per_group: int, tokens: int, rng: random.Random) -> list[Group]:
    out = []
    for g in range(groups):
        completions = [RolloutCompletion([rng.randrange(60) for _ in range(tokens)], [-rng.random()] * tokens,
                                         "abcdefghij"[:tokens], "stop", [0] * tokens) for _ in range(per_group)]
        prompt = [{"role": "user", "content": "Reverse the text character-by-character: hello there"}]
        out.append(Group("reverse-text", Example(prompt, "ereht olleh", {"id": g}),
                         ChatResult(list(range(27)), 0, completions), [rng.random() for _ in range(per_group)],
                         [{"lcs": 0.5}] * per_group, rollouts=[Rollout([]) for _ in range(per_group)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    groups = step_groups(args.groups, args.per_group, args.tokens, random.Random(0))
    advantages = torch.randn(args.groups, args.per_group)
    orchestrator, trainer = [], []
    loss = build_loss({"type": "default"})
    for _ in range(args.repeats):
        start = time.perf_counter()
        written = samples_jsonl(SamplesConfig(), 0, groups, groups, advantages)
        orchestrator.append(time.perf_counter() - start)
        samples = [Sample(g.result.prompt_token_ids, c.token_ids, c.logprobs, 0.5, 0,
                          key=written.keys[(id(g), r, 0)]) for g in groups for r, c in enumerate(g.result.completions)]
        (batch,) = pack_batch(samples, 1024, 1, 0, SamplingRule(), 16, optional=RECORD_FIELDS)
        start = time.perf_counter()
        records = []
        for mb in batch.micro_batches:
            lp = mb.inference_logprobs + 0.01
            inputs = LossInputs(lp, mb.inference_logprobs, mb.advantages, mb.loss_mask, mb.sample_lens)
            out = loss(inputs, LossScale.from_counts([1000, 512, 8], 16), outcomes=True)
            records += micro_batch_outcomes(mb, lp, out.outcomes)
        trainer.append(time.perf_counter() - start)
    print(f"{len(samples)} rollouts of {args.tokens} tokens ({len(written.data) / 2**10:.0f} KiB of samples.jsonl): "
          f"orchestrator {statistics.median(orchestrator) * 1000:.1f} ms per step, trainer's token outcomes "
          f"{statistics.median(trainer) * 1000:.1f} ms per step ({len(records)} records)")


if __name__ == "__main__":
    main()

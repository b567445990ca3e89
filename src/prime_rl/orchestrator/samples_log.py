"""A step's rollouts as readable JSON lines (`[orchestrator.samples]`), written with the trainer's batch in
`rollouts/step_N/samples.jsonl` (`run_dir.samples_file`), so a resumed run rewrites exactly the steps it
regenerates: no duplicates, no holes.

One line per rollout of the step's first ceil(fraction x groups) generated groups (kept or dropped by the
zero-advantage filters), on steps where step % interval == 0:

    step, env, group (index among the step's generated groups), rollout (index in its group), kept (it trains),
    prompt (the example's messages), answer, messages (the conversation after the prompt, as the environment
    scored it: assistant turns, tool and user replies; an agent's recorded calls), completion (the last turn's
    text as sampled, reasoning included), reward, components, advantage (null for a dropped group), error (why the
    rollout failed, or null), finish_reason, truncated, prompt_tokens and completion_tokens (over its samples),
    sampled_tokens, turns, tool_calls, segments (an agent rollout's samples), policy_lag (step - its oldest
    token's weight step), tokens (per sample: `token_record`, its key, the ids, sampler logprobs, which were
    sampled, weight steps)

Lines stop at `max_mib` for the step; a last line `{"step", "left_out": n}` says how many rollouts did not fit.
Each written sample's `key` (0, 1, ... over the file's token records) goes into the trainer's batch
(`sample_keys`), and the trainer writes its logprob and mask reason of each of those samples' tokens under the
same key (`trainer/rl/token_outcomes.py`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from prime_rl.orchestrator.client import RolloutCompletion
from prime_rl.orchestrator.config import SamplesConfig
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.utils.strict_json import finite_rounded


def samples_due(config: SamplesConfig, step: int) -> bool:
    """Whether step `step` writes its samples."""
    return config.interval > 0 and step % config.interval == 0


@dataclass
class SamplesFile:
    """A step's samples.jsonl and the keys of the samples it holds, by (id of the group, rollout, segment)."""

    data: bytes
    keys: dict[tuple[int, int, int], int]


def rollout_record(step: int, index: int, group: Group, rollout: int, advantage: float | None,
                   first_key: int = 0) -> dict[str, Any]:
    """The line of rollout `rollout` of `group` (the step's `index`-th generated group; module docstring), its
    samples keyed `first_key`, `first_key` + 1, ..."""
    pieces = group.trained(rollout)
    completion = group.result.completions[rollout]
    stats = group.stats[rollout] if group.stats else None
    return {
        "step": step, "env": group.env, "group": index, "rollout": rollout, "kept": advantage is not None,
        "prompt": group.example.prompt, "answer": group.example.answer,
        "messages": group.rollouts[rollout].messages if group.rollouts else [],
        "completion": completion.text, "reward": group.rewards[rollout],
        "components": group.components[rollout] if group.components else {}, "advantage": advantage,
        "error": group.errors[rollout] if group.errors else None, "finish_reason": completion.finish_reason,
        "truncated": completion.truncated,
        "prompt_tokens": sum(len(p.prompt_ids) for p in pieces),
        "completion_tokens": sum(len(p.completion.token_ids) for p in pieces),
        "sampled_tokens": stats.sampled_tokens if stats else len(completion.token_ids),
        "turns": stats.turns if stats else 1, "tool_calls": stats.tool_calls if stats else 0,
        "segments": len(pieces), "policy_lag": step - group.policy_step(rollout),
        "tokens": [token_record(piece.completion, first_key + j) for j, piece in enumerate(pieces)],
    }


def token_record(completion: RolloutCompletion, key: int) -> dict[str, Any]:
    """A sample's tokens after its prompt: its key, the ids, the sampler's logprob of each, whether the policy
    sampled it (false: an environment's or a chat template's token between turns, which trains nothing), the weight
    step it was sampled under."""
    n = len(completion.token_ids)
    return {"key": key, "ids": completion.token_ids, "logprobs": finite_rounded(completion.logprobs, 5),
            "sampled": completion.mask if completion.mask is not None else [True] * n,
            "weight_steps": completion.weight_steps}


def samples_jsonl(config: SamplesConfig, step: int, groups: list[Group], kept: list[Group],
                  advantages: torch.Tensor) -> SamplesFile | None:
    """The step's samples file (module docstring), or None when the step writes none. `advantages` are the kept
    groups' rows, in `kept`'s order."""
    if not samples_due(config, step):
        return None
    rows = {id(group): row for group, row in zip(kept, advantages.tolist(), strict=True)}
    budget, lines, left_out, keys = config.max_mib * 2**20, [], 0, {}
    for index, group in enumerate(groups[:math.ceil(config.fraction * len(groups))]):
        row = rows.get(id(group))
        for rollout in range(len(group.rewards)):
            trains = row is not None and group.trains(rollout)  # a failure left out of its kept group trains nothing
            record = rollout_record(step, index, group, rollout, row[rollout] if trains else None, len(keys))
            # errors="replace": a lone surrogate in an environment's text becomes "?" instead of failing the step
            line = json.dumps(record, default=str, ensure_ascii=False).encode(errors="replace") + b"\n"
            if len(line) > budget:
                left_out += 1
                continue
            budget -= len(line)
            lines.append(line)
            if trains:
                keys |= {(id(group), rollout, j): token["key"] for j, token in enumerate(record["tokens"])}
    if left_out:
        lines.append(json.dumps({"step": step, "left_out": left_out}).encode() + b"\n")
    return SamplesFile(b"".join(lines), keys)

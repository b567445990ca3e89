"""The trainer's half of a step's samples on disk: for every sample that `samples.jsonl` holds and this rank trains
(the batch's `sample_keys` >= 0), one JSON line in `rollouts/step_N/token_outcomes_rank_R.jsonl`:

    {"key": k, "logprobs": [...], "advantages": [...], "outcomes": "kkl-..."}

over the sample's completion tokens (the `ids` of its token record with the same key, the first
`completion_lens` of them when the orchestrator cut the sample to `seq_len`): the trainer's logprob of each token
under the batch's sampling rule (5 decimals, null where not finite; r = exp(logprob - the sampler's)), the advantage
the step trains it with (4 decimals; 0 off the loss mask: computed by the trainer for a token-level type, recomputed
under `reward_kl`, per token with a teacher or a `turn_discount`), and what the loss did with it, one character of
`losses.TOKEN_OUTCOMES` each. Both come from the step's first pass, before its first update: with
`update_epochs` > 1 the later passes' ratios (the logged `loss/importance_ratio`) include the step's own drift.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from prime_rl.batch_format import MicroBatch
from prime_rl.run_dir import rollout_dir, token_outcomes_file
from prime_rl.trainer.rl.losses import TOKEN_OUTCOMES
from prime_rl.utils.fs import atomic_path
from prime_rl.utils.strict_json import finite_rounded


def micro_batch_outcomes(mb: MicroBatch, logprobs: torch.Tensor, outcomes: torch.Tensor) -> list[dict]:
    """The records of `mb`'s recorded samples, from the trainer's logprobs [T], the batch's advantages and `Loss`
    outcomes [T]."""
    if mb.sample_keys is None:
        return []
    lp, codes = logprobs.detach().float().cpu().tolist(), outcomes.cpu().tolist()
    advantages = mb.advantages.tolist()
    ends = torch.cumsum(mb.sample_lens, 0).tolist()
    records = []
    for key, end, n in zip(mb.sample_keys.tolist(), ends, mb.completion_lens.tolist(), strict=True):
        if key >= 0:
            records.append({"key": key, "logprobs": finite_rounded(lp[end - n:end], 5),
                            "advantages": finite_rounded(advantages[end - n:end], 4),
                            "outcomes": "".join(TOKEN_OUTCOMES[c] for c in codes[end - n:end])})
    return records


def write_outcomes(output_dir: Path, step: int, rank: int, records: list[dict]) -> None:
    """This rank's records of step `step`, written atomically (a full disk raises and leaves no partial file)."""
    path = token_outcomes_file(rollout_dir(output_dir, step), rank)
    data = b"".join(json.dumps(r).encode() + b"\n" for r in sorted(records, key=lambda r: r["key"]))
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)

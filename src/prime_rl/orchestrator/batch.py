"""Training samples and their packing into the per-rank micro-batches of `prime_rl.batch_format`.

A sample is prompt + completion: `loss_mask` is true on the completion tokens the policy
sampled (a multi-turn completion also holds the environment's tokens between turns:
`completion_mask` false there; no token when the sample is masked), `inference_logprobs`
are the server's logprobs there, and the sample's scalar advantage is broadcast to its
trained tokens, unless it has per-token advantages (`token_advantages`, the OPD advantage of
`advantages/distillation.py`). With a teacher every row carries `teacher_logprobs` (the
teacher's logprob of each trained token); with an advantage type computed in the trainer every row carries
`rewards` (the sample's reward on its last trained token, 0 elsewhere: the trainer computes the
advantages). All of them are 0 off the loss mask. With a group type's `reward_kl` every row
carries `sample_groups` and `sample_rewards` per segment (the sample's group within the step and
its reward; -1 and 0 for a root or padding): the trainer recomputes the group advantages. On a step that writes
`samples.jsonl` every row carries `sample_keys` and `completion_lens` per segment (each sample's `key` there, -1
for one the file leaves out, a root or padding; its completion's length): the trainer records those samples' tokens.

Shared prefixes: consecutive samples with the same prompt (a group's completions) form one
*unit*, its prompt laid out once (`prime_rl.batch_format`: root = prompt[:-1], one branch
[prompt[-1], completion] per sample), as many samples per unit as fit `seq_len`. With 8
completions of a 28-token prompt that trains ~2.7x fewer tokens for the same gradient.

Packing: units are laid end to end into rows of at most `seq_len` tokens (first-fit
decreasing), rows go to trainer ranks greedily (the longest row to the rank with the
fewest tokens, among ranks that still have room), every rank gets the same number of
rows, ceil(rows / ranks) (at least 1), and ranks short of that get all-masked one-token padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prime_rl.batch_format import OPTIONAL_SAMPLE_FIELDS, RECORD_FIELDS, MicroBatch, RankBatch
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.utils.packing import first_fit_decreasing

PAD_TOKEN_ID = 0


@dataclass
class Sample:
    """One rollout as the batch file trains it: its prompt, its completion and the per-token values that go with
    them (module docstring). Not `trainer.sft.data.SFTExample`, a tokenized SFT conversation."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    advantage: float
    policy_step: int
    train: bool = True  # false: every loss_mask entry is false (e.g. a masked truncated completion)
    completion_mask: list[bool] | None = None  # per completion token: sampled by the policy (None: all were)
    teacher_logprobs: list[float] | None = None  # per completion token: the teacher's logprob (teacher_scoring.py)
    token_advantages: list[float] | None = None  # per completion token: replaces `advantage` when set
    reward: float = 0.0  # the sample's reward (the batch's `rewards`, for token-level advantage types)
    group: int = -1  # the sample's group within the step (the batch's `sample_groups`)
    key: int = -1  # its token record's key in the step's samples.jsonl (the batch's `sample_keys`; -1: none)

    def trained(self) -> list[bool]:
        """Per completion token: does it carry loss."""
        if not self.train:
            return [False] * len(self.completion_ids)
        return list(self.completion_mask) if self.completion_mask is not None else [True] * len(self.completion_ids)

    def token_rewards(self) -> list[float]:
        """Per completion token: the reward on the last trained token, 0 elsewhere (all 0 if none trains)."""
        trained = self.trained()
        out = [0.0] * len(trained)
        last = max((i for i, t in enumerate(trained) if t), default=None)
        if last is not None:
            out[last] = self.reward
        return out

    def optional(self, name: str) -> list[float] | None:
        """Per completion token values of the batch's optional field `name` (`OPTIONAL_FIELDS`)."""
        return self.teacher_logprobs if name == "teacher_logprobs" else self.token_rewards()

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def truncate(self, max_len: int) -> Sample:
        """Drop completion tokens past `max_len` total tokens (the prompt is kept whole)."""
        keep = max(0, max_len - len(self.prompt_ids))
        if keep >= len(self.completion_ids):
            return self
        if len(self.prompt_ids) >= max_len:
            raise ValueError(f"a prompt of {len(self.prompt_ids)} tokens does not fit seq_len {max_len}")
        def cut(values: list | None) -> list | None:
            return values[:keep] if values is not None else None

        return Sample(self.prompt_ids, self.completion_ids[:keep], self.completion_logprobs[:keep],
                      self.advantage, self.policy_step, self.train, cut(self.completion_mask),
                      cut(self.teacher_logprobs), cut(self.token_advantages), self.reward, self.group, self.key)


def assign_rows(row_tokens: list[int], world_size: int) -> list[list[int]]:
    """Rows per rank: equal counts (ceil(rows / world_size) at most), token totals balanced greedily."""
    per_rank = max(1, -(-len(row_tokens) // world_size))
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for r in sorted(range(len(row_tokens)), key=lambda r: -row_tokens[r]):
        open_ranks = [k for k in range(world_size) if len(ranks[k]) < per_rank]
        k = min(open_ranks, key=lambda k: (totals[k], len(ranks[k])))
        ranks[k].append(r)
        totals[k] += row_tokens[r]
    return ranks


def unit_length(samples: list[Sample]) -> int:
    """Tokens of a unit: one sample alone, or the shared prompt once (minus its last token) plus a
    branch [last prompt token, completion] per sample."""
    if len(samples) == 1:
        return len(samples[0])
    return len(samples[0].prompt_ids) - 1 + sum(1 + len(s.completion_ids) for s in samples)


def make_units(samples: list[Sample], seq_len: int, share_prompts: bool = True) -> list[list[Sample]]:
    """Consecutive samples with the same prompt (of 2+ tokens) as units of at most `seq_len` tokens; every
    sample its own unit without `share_prompts`."""
    units: list[list[Sample]] = []
    for s in samples:
        last = units[-1] if units else None
        if (share_prompts and last is not None and len(s.prompt_ids) > 1 and last[0].prompt_ids == s.prompt_ids
                and unit_length(last + [s]) <= seq_len):
            last.append(s)
        else:
            units.append([s])
    return units


class _Row:
    """Token lists of one micro-batch under construction."""

    def __init__(self, optional: tuple[str, ...] = ()):
        self.ids, self.positions, self.mask, self.logprobs, self.advantages = [], [], [], [], []
        self.lens, self.steps, self.groups, self.rewards, self.keys, self.completions = [], [], [], [], [], []
        self.per_sample = any(name in OPTIONAL_SAMPLE_FIELDS for name in optional)
        self.recorded = any(name in RECORD_FIELDS for name in optional)
        self.optional: dict[str, list[float]] = {
            name: [] for name in optional if name not in OPTIONAL_SAMPLE_FIELDS + RECORD_FIELDS}

    def segment(self, context: list[int], first_position: int, s: Sample | None, policy_step: int) -> None:
        """Append a segment from `first_position`: `context` tokens (not trained), then `s`'s completion
        (none for a root). Per-token values stay 0 off the loss mask (the contract)."""
        completion, logprobs = (s.completion_ids, s.completion_logprobs) if s is not None else ([], [])
        trained = s.trained() if s is not None else []
        n = len(completion)
        self.ids += context + completion
        self.positions += list(range(first_position, first_position + len(context) + n))
        self.mask += [False] * len(context) + trained
        self.logprobs += [0.0] * len(context) + [lp if t else 0.0 for lp, t in zip(logprobs, trained, strict=True)]
        advantages = s.token_advantages if s is not None and s.token_advantages is not None else [
            s.advantage if s is not None else 0.0] * n
        self.advantages += [0.0] * len(context) + [a if t else 0.0 for a, t in zip(advantages, trained, strict=True)]
        for name, values in self.optional.items():
            own = (s.optional(name) if s is not None else None) or [0.0] * n
            values += [0.0] * len(context) + [v if t else 0.0 for v, t in zip(own, trained, strict=True)]
        self.lens.append(len(context) + n)
        self.steps.append(policy_step)
        self.groups.append(s.group if s is not None else -1)
        self.rewards.append(s.reward if s is not None else 0.0)
        self.keys.append(s.key if s is not None else -1)
        self.completions.append(n)

    def unit(self, samples: list[Sample]) -> None:
        prompt = samples[0].prompt_ids
        if len(samples) == 1:
            self.segment(prompt, 0, samples[0], samples[0].policy_step)
            return
        self.segment(prompt[:-1], 0, None, min(s.policy_step for s in samples))  # the root: trains nothing
        for s in samples:
            self.segment(prompt[-1:], len(prompt) - 1, s, s.policy_step)

    def micro_batch(self) -> MicroBatch:
        return MicroBatch(
            input_ids=torch.tensor(self.ids, dtype=torch.long),
            position_ids=torch.tensor(self.positions, dtype=torch.long),
            sample_lens=torch.tensor(self.lens, dtype=torch.long),
            loss_mask=torch.tensor(self.mask, dtype=torch.bool),
            inference_logprobs=torch.tensor(self.logprobs, dtype=torch.float32),
            advantages=torch.tensor(self.advantages, dtype=torch.float32),
            policy_step=torch.tensor(self.steps, dtype=torch.long),
            **{name: torch.tensor(values, dtype=torch.float32) for name, values in self.optional.items()},
            **({"sample_groups": torch.tensor(self.groups, dtype=torch.long),
                "sample_rewards": torch.tensor(self.rewards, dtype=torch.float32)} if self.per_sample else {}),
            **({"sample_keys": torch.tensor(self.keys, dtype=torch.long),
                "completion_lens": torch.tensor(self.completions, dtype=torch.long)} if self.recorded else {}),
        )


def micro_batch(units: list[list[Sample]], optional: tuple[str, ...] = ()) -> MicroBatch:
    """One packed row of `units` (see `make_units`), with the optional fields named in `optional`
    (`teacher_logprobs`, `rewards`; `sample_groups`, which brings `sample_rewards`; `sample_keys`, which brings
    `completion_lens`)."""
    row = _Row(optional)
    for unit in units:
        row.unit(unit)
    return row.micro_batch()


def padding_micro_batch(optional: tuple[str, ...] = ()) -> MicroBatch:
    """A one-token row that trains nothing: keeps every rank's micro-batch count equal."""
    return micro_batch([[Sample([PAD_TOKEN_ID], [], [], 0.0, 0, train=False)]], optional)


def pack_batch(samples: list[Sample], seq_len: int, world_size: int, step: int, rule: SamplingRule,
               max_tokens: int, share_prompts: bool = True, optional: tuple[str, ...] = (),
               advantage: str | None = None) -> list[RankBatch]:
    """Pack `samples` into one `RankBatch` per trainer rank, all with the same number of micro-batches;
    `rule` is the distribution they were sampled from (the trainer scores tokens under it), `advantage` the
    advantage type (the trainer checks it runs the same). Every row, padding included, carries the optional
    per-token fields named in `optional`."""
    units = make_units(samples, seq_len, share_prompts)
    lengths = [unit_length(u) for u in units]
    rows = first_fit_decreasing(lengths, seq_len, item="unit (a sample, or samples sharing a prompt)")
    row_tokens = [sum(lengths[i] for i in row) for row in rows]
    per_rank = assign_rows(row_tokens, world_size)
    count = max(1, max(len(r) for r in per_rank))  # an empty batch still gives every rank one (padding) row
    batches = []
    for rank_rows in per_rank:
        mbs = [micro_batch([units[i] for i in rows[r]], optional) for r in rank_rows]
        mbs += [padding_micro_batch(optional) for _ in range(count - len(mbs))]
        batches.append(RankBatch(step, rule.temperature, max_tokens, mbs, rule.top_k, rule.top_p, rule.min_p,
                                 advantage))
    return batches

"""The rollout-batch file: the one contract between orchestrator and trainer.

`rollouts/step_N/rank_R.pt` holds what trainer rank R trains on at step N:

    {
      "step": N,                       # the optimizer step this batch is for
      "temperature": float,            # sampling temperature (trainer divides logits by it)
      "top_k": int, "top_p": float, "min_p": float,   # the sampler's truncation (-1, 1.0, 0.0: none; absent
                                       # in files of older versions, read as none): `models.sampling_rule`
      "max_tokens": int,               # completion budget per sample (LossScale's L)
      "advantage": str,                # the orchestrator's advantage type (absent in older files); the
                                       # trainer's must agree: a token-level type computes them itself
      "micro_batches": [MicroBatch-as-dict, ...],
    }

Every rank's file of one step holds the same number of micro-batches (FSDP needs every
rank in every forward); a padding micro-batch has `loss_mask` all false.

A micro-batch is one packed row, flat over its T <= seq_len tokens. Token t of the row is
`input_ids[t]`; `loss_mask[t]`, `inference_logprobs[t]` and `advantages[t]` describe that
token (its logprob is predicted from position t - 1), so the first token of every sample
is never trained. Samples are laid end to end as *segments* (`sample_lens`). Optional per-token
fields: `ref_logprobs`, `teacher_logprobs` (on-policy distillation) and `rewards` (token-level
advantage types: each sample's reward on its last trained token, 0 elsewhere; `advantages` is
then 0 and the trainer computes them). Optional per-segment fields (group types with
`reward_kl`, whose advantages the trainer recomputes): `sample_groups` (the sample's group
within the step, -1 for a root or padding) and `sample_rewards` (its reward, 0 there). On a step that
writes `samples.jsonl`, every row carries `sample_keys` (the `key` of the sample's token record in that
file, -1 for a root, padding or a sample the file leaves out) and `completion_lens` (how many of the
segment's last tokens are the sample's completion): the trainer writes its own per-token record of
those samples (`trainer/rl/token_outcomes.py`).

Shared prefixes: a segment whose `position_ids` start at 0 is a *root*. A segment starting
at p > 0 is a *branch*: it continues the nearest preceding root, which must be exactly p
tokens long, and its tokens see that root's tokens as their first p positions. So the
completions of one prompt P can share it: root = P[:-1] (never trained), then one branch
[P[-1], completion] per completion (P[-1] predicts the completion's first token inside
the branch, so every segment's first token is the only one nothing predicts). A root and
its branches form a *unit*; units never see each other. A branch is one sample: its
`policy_step`, its trained tokens; a root trains nothing. Each branch computes exactly
what the full sample P + completion computes alone.

The step directory is written atomically (all ranks' files appear at once).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.run_dir import rollout_dir, rollout_file, samples_file
from prime_rl.utils.fs import atomic_dir

OPTIONAL_TOKEN_FIELDS = ("ref_logprobs", "teacher_logprobs", "rewards")
OPTIONAL_SAMPLE_FIELDS = ("sample_groups", "sample_rewards")
RECORD_FIELDS = ("sample_keys", "completion_lens")


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # long [T]
    position_ids: torch.Tensor  # long [T], consecutive within a segment; 0 at a root's start, p at a branch's
    sample_lens: torch.Tensor  # long [S] segment lengths, sums to T
    loss_mask: torch.Tensor  # bool [T], true on completion tokens that train
    inference_logprobs: torch.Tensor  # float32 [T], logprob of input_ids[t] under the sampler, 0 off-mask
    advantages: torch.Tensor  # float32 [T]
    policy_step: torch.Tensor  # long [S], weight step that generated each sample
    ref_logprobs: torch.Tensor | None = None  # float32 [T]
    teacher_logprobs: torch.Tensor | None = None  # float32 [T]
    rewards: torch.Tensor | None = None  # float32 [T]: a sample's reward on its last trained token, else 0
    sample_groups: torch.Tensor | None = None  # long [S]: each segment's group within the step (-1: no sample)
    sample_rewards: torch.Tensor | None = None  # float32 [S]: each segment's reward (0: no sample)
    sample_keys: torch.Tensor | None = None  # long [S]: the sample's token-record key in samples.jsonl (-1: none)
    completion_lens: torch.Tensor | None = None  # long [S]: completion tokens at the end of each segment
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def trained_samples(self) -> torch.Tensor:
        """Bool [S]: the samples with at least one trained token (a padding row's sample has none)."""
        return torch.segment_reduce(self.loss_mask.float(), "sum", lengths=self.sample_lens) > 0

    @property
    def scored_tokens(self) -> torch.Tensor:
        """Bool [T]: the tokens whose trainer logprob anything reads: the trained ones and, when the batch records
        them (`completion_lens`), every completion token (`trainer/rl/token_outcomes.py`). Prompt tokens are not
        among them, so the output head skips their positions (`trainer.model.score_rows`)."""
        scored = self.loss_mask.clone()
        if self.completion_lens is not None:
            ends = torch.cumsum(self.sample_lens, 0)
            for end, n in zip(ends.tolist(), self.completion_lens.tolist(), strict=True):
                scored[end - n:end] = True
        return scored

    @property
    def num_samples(self) -> int:
        """Samples with at least one trained token (padding rows count zero)."""
        return int(self.trained_samples.sum())

    def validate(self) -> None:
        T = self.num_tokens
        if T == 0:
            raise ValueError("micro-batch has no tokens (a padding micro-batch has one)")
        for name in ("position_ids", "loss_mask", "inference_logprobs", "advantages", *OPTIONAL_TOKEN_FIELDS):
            value = getattr(self, name)
            if value is not None and value.shape != (T,):
                raise ValueError(f"micro-batch field {name} has shape {tuple(value.shape)}, expected ({T},)")
        if int(self.sample_lens.sum()) != T:
            raise ValueError(f"sample_lens sum to {int(self.sample_lens.sum())}, expected {T}")
        for name in ("policy_step", *OPTIONAL_SAMPLE_FIELDS, *RECORD_FIELDS):
            value = getattr(self, name)
            if value is not None and value.shape != self.sample_lens.shape:
                raise ValueError(f"{name} must have one entry per sample")
        segment_roots(self.position_ids, self.sample_lens)  # raises on a malformed layout

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, data: dict) -> MicroBatch:
        return cls(**data)


def segment_roots(position_ids: torch.Tensor, sample_lens: torch.Tensor) -> list[int]:
    """Per segment: the index of the root it continues, or -1 for a root (the module docstring's rule).

    Raises ValueError when a segment is empty, its positions are not consecutive, a branch has
    no root before it, or its root is not exactly as long as the branch's first position."""
    roots, last_root = [], -1
    starts = torch.cumsum(sample_lens, 0) - sample_lens
    for index, (start, length) in enumerate(zip(starts.tolist(), sample_lens.tolist(), strict=True)):
        if length <= 0:
            raise ValueError(f"segment {index} is empty (sample_lens {length})")
        positions = position_ids[start:start + length]
        first = int(positions[0])
        if not torch.equal(positions, torch.arange(first, first + length)):
            raise ValueError(f"segment {index}: position ids are not consecutive")
        if first == 0:
            roots.append(-1)
            last_root = index
            continue
        if first < 0:
            raise ValueError(f"segment {index} starts at negative position {first}")
        if last_root < 0:
            raise ValueError(f"segment {index} starts at position {first} (a branch) but no root (position 0) "
                             "comes before it")
        if int(sample_lens[last_root]) != first:
            raise ValueError(f"segment {index} starts at position {first} (a branch) but its root, segment "
                             f"{last_root}, is {int(sample_lens[last_root])} tokens long")
        roots.append(last_root)
    return roots


def row_units(position_ids: torch.Tensor, sample_lens: torch.Tensor) -> list[tuple[int, int, list[int]]]:
    """The units of a row, in order: (first token, token count, segment lengths) of each root with its
    branches (a lone sample is a unit of one segment)."""
    units: list[tuple[int, int, list[int]]] = []
    start = 0
    for root, length in zip(segment_roots(position_ids, sample_lens), sample_lens.tolist(), strict=True):
        if root < 0 or not units:
            units.append((start, 0, []))
        first, count, lens = units[-1]
        units[-1] = (first, count + length, lens + [length])
        start += length
    return units


@dataclass
class RankBatch:
    step: int
    temperature: float
    max_tokens: int
    micro_batches: list[MicroBatch]
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    advantage: str | None = None  # the orchestrator's advantage type (None in files of older versions)

    @property
    def rule(self) -> SamplingRule:
        """The distribution the batch's tokens were sampled from."""
        return SamplingRule(self.temperature, self.top_k, self.top_p, self.min_p)


def write_step(output_dir: Path, step: int, per_rank: list[RankBatch], samples: bytes | None = None) -> Path:
    """Write all ranks' batches of `step` at once (atomic directory rename), and `samples` (the step's readable
    JSON lines, `samples_file`) with them when given."""
    counts = {len(b.micro_batches) for b in per_rank}
    if len(counts) != 1:
        raise ValueError(f"every rank needs the same number of micro-batches, got {sorted(counts)}")
    target = rollout_dir(output_dir, step)
    with atomic_dir(target) as tmp:
        for rank, batch in enumerate(per_rank):
            for mb in batch.micro_batches:
                mb.validate()
            payload = {
                "step": batch.step,
                "temperature": batch.temperature,
                "max_tokens": batch.max_tokens,
                "top_k": batch.top_k,
                "top_p": batch.top_p,
                "min_p": batch.min_p,
                "advantage": batch.advantage,
                "micro_batches": [mb.to_dict() for mb in batch.micro_batches],
            }
            buffer = io.BytesIO()  # then one plain write: a full disk is an OSError naming the file
            torch.save(payload, buffer)
            rollout_file(tmp, rank).write_bytes(buffer.getbuffer())
        if samples is not None:
            samples_file(tmp).write_bytes(samples)
    return target


def read_rank(output_dir: Path, step: int, rank: int) -> RankBatch:
    """Load one rank's batch (the caller waits for the step directory first)."""
    payload = torch.load(rollout_file(rollout_dir(output_dir, step), rank), weights_only=True)
    return RankBatch(
        step=payload["step"],
        temperature=payload["temperature"],
        max_tokens=payload["max_tokens"],
        micro_batches=[MicroBatch.from_dict(d) for d in payload["micro_batches"]],
        top_k=payload.get("top_k", -1),
        top_p=payload.get("top_p", 1.0),
        min_p=payload.get("min_p", 0.0),
        advantage=payload.get("advantage"),
    )

"""Training samples and their packing into the per-rank micro-batches of `utils.batch_format`.

A sample is prompt + completion: `loss_mask` is true on the completion tokens (none when
masked), `inference_logprobs` are the server's logprobs there, and the sample's scalar
advantage is broadcast to its completion tokens (both 0 off the loss mask).

Packing: samples are laid end to end into rows of at most `seq_len` tokens (first-fit
decreasing), rows go to trainer ranks greedily (the longest row to the rank with the
fewest tokens, among ranks that still have room), every rank gets the same number of
rows, ceil(rows / ranks) (at least 1), and ranks short of that get all-masked one-token padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prime_rl.utils.batch_format import MicroBatch, RankBatch

PAD_TOKEN_ID = 0


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    advantage: float
    policy_step: int
    train: bool = True  # false: every loss_mask entry is false (e.g. a masked truncated completion)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    def truncate(self, max_len: int) -> Sample:
        """Drop completion tokens past `max_len` total tokens (the prompt is kept whole)."""
        keep = max(0, max_len - len(self.prompt_ids))
        if keep >= len(self.completion_ids):
            return self
        if len(self.prompt_ids) >= max_len:
            raise ValueError(f"a prompt of {len(self.prompt_ids)} tokens does not fit seq_len {max_len}")
        return Sample(self.prompt_ids, self.completion_ids[:keep], self.completion_logprobs[:keep],
                      self.advantage, self.policy_step, self.train)


def pack_rows(lengths: list[int], seq_len: int) -> list[list[int]]:
    """First-fit decreasing: indices of samples per row, every row's total length <= seq_len."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > seq_len:
            raise ValueError(f"sample {i} has {lengths[i]} tokens, more than seq_len {seq_len}")
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(seq_len - lengths[i])
    return rows


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


def micro_batch(samples: list[Sample]) -> MicroBatch:
    """One packed row of `samples` (position ids restart per sample)."""
    input_ids, positions, mask, logprobs, advantages = [], [], [], [], []
    for s in samples:
        n_prompt, n_completion = len(s.prompt_ids), len(s.completion_ids)
        input_ids += s.prompt_ids + s.completion_ids
        positions += list(range(len(s)))
        mask += [False] * n_prompt + [s.train] * n_completion
        # The contract keeps per-token values at 0 off the loss mask (prompts, masked samples).
        logprobs += [0.0] * n_prompt + (list(s.completion_logprobs) if s.train else [0.0] * n_completion)
        advantages += [0.0] * n_prompt + [s.advantage if s.train else 0.0] * n_completion
    return MicroBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
        sample_lens=torch.tensor([len(s) for s in samples], dtype=torch.long),
        loss_mask=torch.tensor(mask, dtype=torch.bool),
        inference_logprobs=torch.tensor(logprobs, dtype=torch.float32),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        policy_step=torch.tensor([s.policy_step for s in samples], dtype=torch.long),
    )


def padding_micro_batch() -> MicroBatch:
    """A one-token row that trains nothing: keeps every rank's micro-batch count equal."""
    return micro_batch([Sample([PAD_TOKEN_ID], [], [], 0.0, 0, train=False)])


def pack_batch(samples: list[Sample], seq_len: int, world_size: int, step: int, temperature: float,
               max_tokens: int) -> list[RankBatch]:
    """Pack `samples` into one `RankBatch` per trainer rank, all with the same number of micro-batches."""
    rows = pack_rows([len(s) for s in samples], seq_len)
    row_tokens = [sum(len(samples[i]) for i in row) for row in rows]
    per_rank = assign_rows(row_tokens, world_size)
    count = max(1, max(len(r) for r in per_rank))  # an empty batch still gives every rank one (padding) row
    batches = []
    for rank_rows in per_rank:
        mbs = [micro_batch([samples[i] for i in rows[r]]) for r in rank_rows]
        mbs += [padding_micro_batch() for _ in range(count - len(mbs))]
        batches.append(RankBatch(step=step, temperature=temperature, max_tokens=max_tokens, micro_batches=mbs))
    return batches

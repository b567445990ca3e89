"""How packed rows (`prime_rl.batch_format`) become one model forward.

A row's *units* (a sample alone, or a shared prompt root with its branches) never see each
other, so the forward does not need the row's [T, T] mask: attention is computed per unit.

- `sdpa` / `eager`: the units of all rows are packed (first-fit decreasing) into the rows
  of a padded batch [B, W], W = the longest unit, with a mask [B, 1, W, W]: token i sees
  token j iff they are in the same segment and j <= i, or j is in the root that i's branch
  continues. Padding is a segment of its own (never seen, never fully masked). Attention
  cost per token grows with W, not with the input row's length, so long rows of short
  samples cost what short rows do.
- `flash_attention_2`: the varlen kernel takes one packed row whose samples restart their
  position ids; it cannot share a root between branches, so each branch is laid out as the
  full sample root + branch (the root's tokens computed once per branch). Only the input
  rows' own positions get logits (`keep`), not the repeated roots. The orchestrator does
  not share prompts when `rl`'s trainer uses this kernel (`orchestrator.share_prompts`), so
  a forward stays within seq_len; the layout still reads shared rows correctly.

`ForwardLayout.index[r]` maps token t of input row r to its place in the flattened [B * W]
(or, with `keep`, [len(keep)]) logits, so `logits.flatten(0, 1)[index[r]]` are row r's
logits in its own order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prime_rl.batch_format import row_units
from prime_rl.utils.packing import first_fit_decreasing

Row = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (input_ids, position_ids, sample_lens)
PADDING_SEGMENT = -1  # the segment id of padding tokens: no real token's root
NO_ROOT = -2  # the root id of a token that is not in a branch


@dataclass
class ForwardLayout:
    input_ids: torch.Tensor  # long [B, W]
    position_ids: torch.Tensor  # long [B, W]
    attention_mask: torch.Tensor | None  # bool [B, 1, W, W]; None: plain causal (flash: rows restart positions)
    index: list[torch.Tensor]  # per input row: long [T_r] into the flattened logits
    keep: torch.Tensor | None = None  # long [K]: the sequence positions to compute logits for (B = 1), None: all


def _units(rows: list[Row]) -> list[tuple[int, int, list[int]]]:
    """(row, first token, segment lengths) of every unit of every row."""
    found = []
    for r, (_, positions, lens) in enumerate(rows):
        found += [(r, first, seg_lens) for first, _, seg_lens in row_units(positions.cpu(), lens.cpu())]
    return found


def _flat_tokens(first: int, seg_lens: list[int]) -> list[torch.Tensor]:
    """Token indices (within the row) of each segment of a unit."""
    out, start = [], first
    for n in seg_lens:
        out.append(torch.arange(start, start + n))
        start += n
    return out


def padded_layout(rows: list[Row], pad_id: int = 0) -> ForwardLayout:
    """Units packed first-fit decreasing into the rows of a padded batch [B, W], W = the longest unit,
    with tree-causal masks that never cross a unit (see the module docstring)."""
    units = _units(rows)
    lengths = [sum(lens) for _, _, lens in units]
    width = max(lengths)
    bins = first_fit_decreasing(lengths, width, "the longest unit")
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    seg = torch.full((len(bins), width), PADDING_SEGMENT, dtype=torch.long)
    root = torch.full((len(bins), width), NO_ROOT, dtype=torch.long)
    index = [torch.empty(int(r[0].numel()), dtype=torch.long) for r in rows]
    segments = 0  # a batch-wide segment id per segment
    for b, members in enumerate(bins):
        at = 0
        for u in members:
            r, first, seg_lens = units[u]
            n = lengths[u]
            row_ids, row_pos, _ = rows[r]
            ids[b, at:at + n] = row_ids[first:first + n].cpu()
            pos[b, at:at + n] = row_pos[first:first + n].cpu()
            seg[b, at:at + n] = segments + torch.repeat_interleave(torch.arange(len(seg_lens)), torch.tensor(seg_lens))
            if len(seg_lens) > 1:  # branches continue the unit's first segment, its root
                root[b, at + seg_lens[0]:at + n] = segments
            index[r][first:first + n] = b * width + at + torch.arange(n)
            segments += len(seg_lens)
            at += n
    device = rows[0][0].device
    index = [i.to(device) for i in index]
    if bool((seg == seg[:, :1]).all()) and bool((seg[:, 0] >= 0).all()):
        # Every row is one whole segment: the mask is plain causal, which attention computes without one
        # (no [B, W, W] mask: 1 GB as float at W = 16k).
        return ForwardLayout(ids.to(device), pos.to(device), None, index)
    # Padding is one segment per row, causal among itself (so no query row is fully masked).
    same = (seg[:, None, :] == seg[:, :, None]) & torch.ones(width, width, dtype=torch.bool).tril()
    mask = same | (seg[:, None, :] == root[:, :, None])
    return ForwardLayout(ids.to(device), pos.to(device), mask[:, None].to(device), index)


def flash_layout(rows: list[Row]) -> ForwardLayout:
    """One packed row [1, N]: every branch expanded to root + branch, position ids restarting per sample."""
    parts_ids, parts_pos, index = [], [], []
    offset = 0
    for r, (row_ids, row_pos, _) in enumerate(rows):
        row_index = torch.empty(int(row_ids.numel()), dtype=torch.long)
        for first, _, seg_lens in row_units(row_pos.cpu(), rows[r][2].cpu()):
            segments = _flat_tokens(first, seg_lens)
            samples = [segments[0]] if len(segments) == 1 else [torch.cat([segments[0], b]) for b in segments[1:]]
            for k, tokens in enumerate(samples):
                n = len(tokens)
                parts_ids.append(row_ids.cpu()[tokens])
                parts_pos.append(torch.arange(n))
                where = offset + torch.arange(n)
                if k == 0:
                    row_index[tokens] = where  # the root's tokens read from their first copy
                else:
                    row_index[tokens[len(segments[0]):]] = where[len(segments[0]):]
                offset += n
        index.append(row_index)
    keep = torch.cat(index).unique(sorted=True)  # each row token once: no logits for repeated roots
    device = rows[0][0].device
    return ForwardLayout(torch.cat(parts_ids)[None].to(device), torch.cat(parts_pos)[None].to(device), None,
                         [torch.searchsorted(keep, i).to(device) for i in index], keep.to(device))

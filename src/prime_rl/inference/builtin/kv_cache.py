"""The builtin engine's KV cache: the running batch's cache and attention mask (`BatchCache`), and the padding,
row copies and position ids every cache the engine builds follows.

The running batch is one transformers `DynamicCache` with one row per running sequence (row i is the engine's
sequence i) and its attention mask [B, width] (1 = real token). Invariants, kept by everything here:

- Every row ends at the same cache position. Prompts are left-padded (`left_padded`), and rows of different
  widths are merged by left-padding the shorter side (`BatchCache.add`), so one decode step appends one column
  for every row (`BatchCache.extend`).
- Padding is masked: a padding position has mask 0 in its row (whatever its keys and values: zeros from
  `left_pad`, or a pad token's from a prefill), so attention never reads it.
- Position ids count only real tokens (`position_ids`): a row's first real token is position 0 however much
  padding precedes it (padding gets position 0; it is masked anyway).

So a row computes what it would compute alone. When rows retire (`BatchCache.retire`), the last rows move into
their places and the leading columns that are padding in every remaining row are dropped.

Within one prefill, prompts that share a prefix (the samples of one prompt a teacher scores) are prefilled once:
`shared_prefixes` groups them, and `Engine._prefill_shared` runs each group's prefix, copies its rows to every
member (`take_rows`), then runs each member's rest on its copy; the cache then holds prefix padding, prefix,
rest padding, rest (padding masked, positions counting real tokens only).

Across requests, a conversation's cache is reused (`PrefixStore`): a sequence that finishes leaves its keys and
values under its token ids (the prompt and every sampled token but the last, which was never fed), and a later
prompt that continues it (the next turn of a multi-turn rollout or an agent session: those ids, then the template
tail and the new messages) is prefilled only past the longest stored prefix (`Engine._prefill_on_stored`): the
stored rows, left-padded to a common width, are the cache its rest is run on, with the same masking and position
rule as any prefill. A turn then costs its new tokens, not the whole conversation.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict

import torch
from transformers import DynamicCache

SHARE_MIN_SAVING = 0.25  # two prefill forwards only when sharing prefixes saves at least this share of the tokens

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
"""One sequence's cache: per layer its keys and values [H, L, D] (real tokens only)."""


class PrefixStore:
    """Finished sequences' caches by their token ids, least recently used first out, within `capacity_bytes`
    (0: nothing is kept; each entry counts its own keys and values: entries copied out together, `row_caches`,
    share one tensor, which is freed with the last of them). `longest(prompt)` finds the longest stored id list
    the prompt starts with: an exact byte-prefix lookup per stored length, longest first. Entries hold keys and
    values computed under one weight step: the engine clears the store when its weights change."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self._entries: OrderedDict[bytes, LayerKV] = OrderedDict()
        self._lengths: dict[int, int] = {}  # stored id-list length -> entries of that length
        self.bytes = 0
        self.hits = 0  # lookups that found a prefix, and the tokens they saved (for benchmarks and tests)
        self.saved_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _key(ids: list[int]) -> bytes:
        return array("q", ids).tobytes()

    def save(self, ids: list[int], layers: LayerKV) -> None:
        """Keep `layers` (the keys and values of exactly `ids`) under `ids`, evicting the oldest entries to fit."""
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        key = self._key(ids)
        if not ids or size > self.capacity or key in self._entries:
            return
        while self.bytes + size > self.capacity:
            self._drop(next(iter(self._entries)))
        self._entries[key] = layers
        self._lengths[len(ids)] = self._lengths.get(len(ids), 0) + 1
        self.bytes += size

    def longest(self, prompt: list[int]) -> tuple[int, LayerKV] | None:
        """(P, the first P tokens' keys and values) of the longest stored id list `prompt` starts with, P at most
        len(prompt) - 1 (the last prompt token is run to sample from); None without one."""
        key = self._key(prompt)
        for length in sorted(self._lengths, reverse=True):
            if length > len(prompt) or (layers := self._entries.get(key[:8 * length])) is None:
                continue
            self._entries.move_to_end(key[:8 * length])
            used = min(length, len(prompt) - 1)
            if used < 1:
                return None
            self.hits += 1
            self.saved_tokens += used
            return used, [(k[:, :used], v[:, :used]) for k, v in layers]
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.bytes = 0

    def _drop(self, key: bytes) -> None:
        layers = self._entries.pop(key)
        length = len(key) // 8
        self._lengths[length] -= 1
        if not self._lengths[length]:
            del self._lengths[length]
        self.bytes -= sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def row_caches(cache: DynamicCache, mask: torch.Tensor, rows: list[int]) -> list[LayerKV]:
    """Each of `rows`' keys and values at its real positions (mask 1), copied out of the batch's cache by one
    gather per layer and kind: the rows' real positions packed one after another ([N, H, D], N their total), each
    row's part a view [H, L, D] of that copy. A finished step's rows are copied out together this way (one gather
    instead of two copies per row and layer: the builtin engine's retire step), so they share one tensor."""
    masks = mask[rows].bool()
    which, columns = masks.nonzero(as_tuple=True)  # row by row, each row's columns in order
    device = cache.layers[0].keys.device
    batch_rows = torch.tensor(rows)[which].to(device)
    columns = columns.to(device)
    lengths = masks.sum(dim=1).tolist()
    parts: list[LayerKV] = [[] for _ in rows]
    for layer in cache.layers:
        keys = layer.keys[batch_rows, :, columns].split(lengths)  # each [L, H, D]
        values = layer.values[batch_rows, :, columns].split(lengths)
        for part, k, v in zip(parts, keys, values, strict=True):
            part.append((k.transpose(0, 1), v.transpose(0, 1)))
    return parts


def stacked_cache(rows: list[LayerKV | None], width: int) -> tuple[DynamicCache, torch.Tensor]:
    """A cache of `rows` (None: an empty row), each left-padded to `width` positions, and its mask [R, width]."""
    template = next(r for r in rows if r is not None)
    cache = DynamicCache()
    for index, (k0, v0) in enumerate(template):
        def padded(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
            empty = like.new_zeros((like.shape[0], width, like.shape[2]))
            return empty if t is None else left_pad(t, width, 1)
        keys = torch.stack([padded(None if r is None else r[index][0], k0) for r in rows])
        values = torch.stack([padded(None if r is None else r[index][1], v0) for r in rows])
        cache.update(keys, values, index)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r is not None:
            mask[i, width - r[0][0].shape[1]:] = 1
    return cache, mask


class BatchCache:
    """The KV cache and attention mask of the running batch (module docstring): empty (no rows, no cache) until
    the first `add`, and again after `reset` or a `keep` of no row. The engine feeds `cache` and `mask` to the
    model's forward, which appends the new tokens' keys and values to `cache` in place."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, width] 1 = real token

    def __len__(self) -> int:
        """Rows (running sequences)."""
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def width(self) -> int:
        """Cache positions per row, real and padding (the same in every row)."""
        return 0 if self.mask is None else self.mask.shape[1]

    def add(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append prefilled rows (their cache and mask [R, S]) after the running ones, left-padding whichever side
        is narrower so every row still ends at the same position."""
        if self.cache is None:
            self.cache, self.mask = cache, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([left_pad(old.keys, width, 2), left_pad(new.keys, width, 2)])
            old.values = torch.cat([left_pad(old.values, width, 2), left_pad(new.values, width, 2)])
        self.mask = torch.cat([left_pad(self.mask, width, 1), left_pad(mask, width, 1)])

    def extend(self) -> torch.Tensor:
        """Open the decode step's column (one real token in every row) and return the mask [B, width + 1] over the
        cache and that token; the forward then writes the token's keys and values into `cache`."""
        self.mask = torch.cat([self.mask, torch.ones((len(self), 1), dtype=torch.long)], dim=1)
        return self.mask

    def retire(self, rows: list[int]) -> list[int]:
        """Drop the rows `rows` and the leading columns that are padding in every row left; return, for each row
        left in its new place, its old index (the engine reorders its sequences the same way). The rows left keep
        their data but not their order: the last rows move into the places freed, so a step that retires a few
        rows copies those few, not the batch. No row left: empty."""
        gone = set(rows)
        size = len(self)
        left = size - len(gone)
        if left == 0:
            self.reset()
            return []
        holes = sorted(row for row in gone if row < left)
        movers = [row for row in range(left, size) if row not in gone]  # as many as the holes
        order = list(range(left))
        if holes:
            into, source = torch.tensor(holes), torch.tensor(movers)
            self._move_rows(into, source)
            for hole, mover in zip(holes, movers, strict=True):
                order[hole] = mover
        start = int(self.mask[:left].any(dim=0).nonzero()[0])
        self.mask = self.mask[:left, start:]
        for layer in self.cache.layers:  # views: the next decode step's forward copies the cache anyway
            layer.keys, layer.values = layer.keys[:left, :, start:], layer.values[:left, :, start:]
        return order

    @torch.inference_mode()  # the engine's forwards made the cache's tensors under it: writes into them need it
    def _move_rows(self, into: torch.Tensor, source: torch.Tensor) -> None:
        """Rows `source` copied onto rows `into`, in the cache and the mask."""
        self.mask[into] = self.mask[source]
        device = self.cache.layers[0].keys.device
        into, source = into.to(device), source.to(device)
        for layer in self.cache.layers:
            layer.keys[into] = layer.keys[source]
            layer.values[into] = layer.values[source]

    def reset(self) -> None:
        """Drop every row."""
        self.cache, self.mask = None, None


def position_ids(mask: torch.Tensor, new: int) -> torch.Tensor:
    """Position ids [B, new] of the last `new` columns of `mask` [B, S]: real tokens count from 0 in every row;
    padding gets position 0 (it is masked anyway)."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)[:, -new:]


def left_padded(prompts: list[list[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [R, width] and mask [R, width] (1 = real token) of prompts aligned to the right."""
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
    return ids, mask


def take_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep the cache rows `rows` (in that order; a row may repeat: the n choices of one prompt)."""
    index = rows.to(cache.layers[0].keys.device)
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[index], layer.values[index]


def left_pad(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros before it along `dim`, `width` long there."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def shared_prefixes(prompts: list[list[int] | None]) -> tuple[list[int], list[int]] | None:
    """Groups of prompts that share a prefix, for one prefill (`Engine._prefill_shared`): per prompt its group
    (-1: none) and how many of its first tokens the group shares (always fewer than its length), or None when
    sharing would not save `SHARE_MIN_SAVING` of the tokens. A None prompt takes no part.

    Sorted, prompts with a common prefix are neighbours, and a group's shared prefix is the least common prefix
    of neighbouring members; a prompt joins the group before it when that keeps the tokens saved, (members - 1)
    * shared, from falling (so the 8 samples of one prompt group on the prompt, not with every sample on the
    chat template's first tokens)."""
    order = sorted((i for i, p in enumerate(prompts) if p is not None), key=lambda i: prompts[i])
    runs: list[tuple[list[int], int]] = []  # (members, shared length)
    for i in order:
        prompt = prompts[i]
        if runs:
            members, length = runs[-1]
            common = min(length, _common_prefix(prompts[members[-1]], prompt), len(prompt) - 1)
            if common > 0 and len(members) * common >= (len(members) - 1) * length:
                runs[-1] = (members + [i], common)
                continue
        runs.append(([i], len(prompt) - 1))
    group, shared = [-1] * len(prompts), [0] * len(prompts)
    saved = 0
    for g, (members, length) in enumerate(run for run in runs if len(run[0]) > 1 and run[1] > 0):
        for i in members:
            group[i], shared[i] = g, length
        saved += (len(members) - 1) * length
    total = sum(len(p) for p in prompts if p is not None)
    return (group, shared) if total and saved >= SHARE_MIN_SAVING * total else None


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n

"""First-fit-decreasing bin packing: the orchestrator's rows of `seq_len` tokens and the
trainer's padded forward rows (`trainer.attention_layout`) both use it."""

from __future__ import annotations


def first_fit_decreasing(lengths: list[int], capacity: int, what: str = "seq_len",
                         item: str = "item") -> list[list[int]]:
    """Indices of the items per bin, longest items first, every bin's total length <= capacity
    (the error for an item that cannot fit names it as `item` and the capacity as `what`)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if lengths[i] > capacity:
            raise ValueError(f"{item} {i} has {lengths[i]} tokens, more than {what} {capacity}")
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins

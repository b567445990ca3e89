"""Reward helpers shared by the built-in environments."""

from __future__ import annotations

from collections.abc import Sequence


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of `a` and `b` (O(len(a) * len(b)) DP, O(len(b)) memory)."""
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def lcs_ratio(answer: Sequence, completion: Sequence) -> float:
    """2 * LCS(answer, completion) / (len(answer) + len(completion)), in [0, 1]; 1.0 when both are empty.

    This is difflib's `SequenceMatcher.ratio` with an exact LCS: 1 only for an exact match,
    and both missing and extra elements cost (a completion padded with junk scores less).
    """
    total = len(answer) + len(completion)
    if total == 0:
        return 1.0
    return 2.0 * lcs_length(answer, completion) / total

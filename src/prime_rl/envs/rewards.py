"""Reward helpers shared by the built-in environments."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

Options = TypeVar("Options")

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def last_number(text: str) -> str | None:
    """The last number of `text` as written, thousands commas removed ("is 1,000." -> "1000", "3/4", "-2"), or
    None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def parse_number(text: str) -> float | None:
    """The last number in `text` ("1,000" -> 1000, "3/4" -> 0.75), or None."""
    token = last_number(text)
    if token is None:
        return None
    try:
        return float(Fraction(token))
    except (ValueError, ZeroDivisionError):
        return None


def typed_options(cls: type[Options], options: dict[str, Any], fail: Callable[[str], Exception]) -> Options:
    """`cls(**options)` for a dataclass of options that all have defaults (a configured reward's `reward_options`
    table); an unknown name, or a value of another type than its default's (an int stands for a float, a bool is no
    number), raises `fail(message)`."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise fail(f"has no option(s) {', '.join(unknown)} (allowed: {', '.join(known)})")
    for name, value in options.items():
        field = known[name]
        want = type(field.default if field.default is not dataclasses.MISSING else field.default_factory())
        ok = isinstance(value, want) and not (isinstance(value, bool) and want is not bool)
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            kind = "number" if want in (int, float) else {"str": "string", "dict": "table"}.get(want.__name__,
                                                                                                   want.__name__)
            raise fail(f"option {name} must be a {kind}, got {value!r}")
    return cls(**options)


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

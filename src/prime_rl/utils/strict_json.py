"""Non-finite numbers kept out of JSON, which has no NaN or Infinity: hooks for `json.loads` (a number that overflows
a float would become one; used by the inference server's request parsing and by tool-call parsing), and
`finite_rounded` for the numbers prime-rl writes for other tools to read (samples on disk)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def finite_rounded(values: Iterable[float], digits: int) -> list[float | None]:
    """`values` rounded to `digits`, each NaN or infinity written as null (None)."""
    return [round(x, digits) if math.isfinite(x) else None for x in values]


def refuse_constant(name: str):
    """`parse_constant`: `NaN`, `Infinity` and `-Infinity` are a ValueError."""
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def finite_float(text: str) -> float:
    """`parse_float`: a number that overflows to infinity (`1e400`) is a ValueError."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value

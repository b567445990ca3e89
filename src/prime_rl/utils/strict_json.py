"""Hooks for `json.loads` that keep non-finite numbers out: JSON has no NaN or Infinity, and a number that
overflows a float would become one. Used by the inference server's request parsing and by tool-call parsing."""

from __future__ import annotations


def refuse_constant(name: str):
    """`parse_constant`: `NaN`, `Infinity` and `-Infinity` are a ValueError."""
    raise ValueError(f"{name} is not valid JSON (numbers must be finite)")


def finite_float(text: str) -> float:
    """`parse_float`: a number that overflows to infinity (`1e400`) is a ValueError."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value

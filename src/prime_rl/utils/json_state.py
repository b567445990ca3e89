"""Checkpoint state as JSON: exact round trips or a loud failure at save time, never pickle.

`dumps_exact` accepts only what JSON gives back unchanged: dicts with string keys, lists,
str, int, float (NaN/inf included), bool and None. Anything else (a tuple would come back
a list, an int key a string, an object not at all) raises `PrimeError` naming the field,
so a checkpoint never silently loses part of a state dict. RNG states convert explicitly.
"""

from __future__ import annotations

import json

import torch

from prime_rl.utils.errors import PrimeError

_SCALARS = (str, int, float, bool, type(None))


def _check(value, where: str) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PrimeError(f"cannot save {where}: key {key!r} is not a string (JSON would change it)")
            _check(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{where}[{i}]")
    elif not isinstance(value, _SCALARS):
        raise PrimeError(f"cannot save {where}: {type(value).__name__} value {value!r:.80} has no exact JSON form")


def dumps_exact(value, where: str) -> str:
    """JSON text of `value`, or `PrimeError` naming the first field (under `where`) JSON would not restore exactly."""
    _check(value, where)
    return json.dumps(value)


def python_rng_to_json(state: tuple) -> list:
    """`random.getstate()` (version, 625 ints, gauss) as a JSON list."""
    version, internal, gauss = state
    return [version, list(internal), gauss]


def python_rng_from_json(data: list) -> tuple:
    """Inverse of `python_rng_to_json`, for `random.setstate`."""
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


def tensor_rng_to_json(state: torch.Tensor) -> list[int]:
    """A torch RNG state (uint8 tensor) as a list of byte values."""
    return state.tolist()


def tensor_rng_from_json(data: list[int]) -> torch.Tensor:
    return torch.tensor(data, dtype=torch.uint8)

"""Booleans only where a key is on/off.

Pydantic's lax mode reads `true` as 1 for an int or float key, so `--max-steps true`, or
`--max-steps` with its value forgotten (a bare flag is `true`), would run one step. Two
rules close that: a boolean value (also inside a list or tuple) is an error for a key whose
type has no `bool` in it, and a bare `--flag` on the command line is an error unless the
key is boolean.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from prime_rl.configs.describe import model_types, optional_section
from prime_rl.utils.errors import ConfigError

_UNIONS = (typing.Union, types.UnionType)
BOOL_MESSAGE = "true/false is only valid for on/off keys; this key takes a value of its own type"


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold a boolean (`bool`, `Any`, or a union or literal with one)."""
    annotation = _strip_annotated(annotation)
    if annotation is bool or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        return any(admits_bool(a) for a in args)
    if origin is Literal:
        return any(isinstance(a, bool) for a in args)
    return False


def _item_types(annotation: Any, count: int) -> list[Any]:
    """The element type of each of `count` items of a list/tuple type (Any where unknown)."""
    annotation = _strip_annotated(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in _UNIONS:
        sequences = [a for a in map(_strip_annotated, args) if typing.get_origin(a) in (list, tuple)]
        return _item_types(sequences[0], count) if len(sequences) == 1 else [Any] * count
    if origin is list and args:
        return [args[0]] * count
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return [args[0]] * count
        return list(args[:count]) + [Any] * (count - len(args))
    return [Any] * count


def misplaced_bool(annotation: Any, value: Any) -> bool:
    """True when `value` is, or holds as a list/tuple item, a boolean that `annotation` does not allow."""
    if isinstance(value, bool):
        return not admits_bool(annotation)
    if isinstance(value, list | tuple):
        return any(misplaced_bool(t, v) for t, v in zip(_item_types(annotation, len(value)), value, strict=True))
    return False


def reject_misplaced_bools(cls: type[BaseModel], data: Any) -> Any:
    """Model validator (mode 'before') of the config base classes: one error per misplaced boolean.

    A model-level check because pydantic forbids field validators on a union's `type` key;
    the errors carry the key's location, so messages name it like any other bad value.
    """
    if not isinstance(data, dict):
        return data
    errors = [
        InitErrorDetails(type=PydanticCustomError("bool_not_allowed", BOOL_MESSAGE), loc=(name,), input=value)
        for name, value in data.items()
        if name in cls.model_fields and misplaced_bool(cls.model_fields[name].annotation, value)
    ]
    if errors:
        raise ValidationError.from_exception_data(cls.__name__, errors)
    return data


def field_annotations(root: type[BaseModel], dotted: str) -> list[Any]:
    """The types `dotted` (a key as written on the command line) has in `root`; [] when it is unknown.

    Several for a key of a discriminated union section that more than one variant has.
    """
    *sections, last = dotted.replace("-", "_").split(".")
    models: list[type[BaseModel]] = [root]
    for name in sections:
        models = [m for model in models if name in model.model_fields
                  for m in model_types(model.model_fields[name].annotation)]
    return [model.model_fields[last].annotation for model in models if last in model.model_fields]


def check_bare_flags(root: type[BaseModel], flags: Iterable[str]) -> None:
    """A bare `--key` (or `--no-key`) must name a boolean key; a known key of another type needs a value (an optional
    section: `none`, to turn it off)."""
    for key in flags:
        annotations = field_annotations(root, key)
        if annotations and not any(admits_bool(a) for a in annotations):
            if all(optional_section(a) for a in annotations):
                raise ConfigError(f"option --{key} is a section, not an on/off flag: --{key} none turns it off")
            raise ConfigError(f"option --{key} needs a value (--{key} VALUE): it is not an on/off flag")

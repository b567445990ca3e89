"""Walk a config model into one row per key: the source of `--help` and docs/configs.md."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, as written on the command line without the leading --
    type: str
    default: str  # rendered; "" for sections, "(required)" when there is none
    description: str
    condition: str = ""  # e.g. "loss.type=sapo" for a field of one union variant
    is_section: bool = False


def union_members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return union_members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in union_members(a)]
    return [annotation]


def model_types(annotation: Any) -> list[type[BaseModel]]:
    """The BaseModel classes a field may hold (several for a discriminated union)."""
    found = []
    for member in union_members(annotation):
        origin = typing.get_origin(member)
        if origin in (list, tuple) and typing.get_args(member):
            found += model_types(typing.get_args(member)[0])
        elif isinstance(member, type) and issubclass(member, BaseModel):
            found.append(member)
    return found


def none_word_is_none(annotation: Any) -> bool:
    """Whether the text `none` means None for a field of this type: it may hold None and none of its other types
    takes the text itself (a text or path key keeps it, `--wandb.name none`; so does a literal choice of the word,
    `loss.correction.weight = "none"`)."""
    members = union_members(annotation)
    words = {a for m in members if typing.get_origin(m) is Literal for a in typing.get_args(m)}
    texts = any(isinstance(m, type) and issubclass(m, str | Path) for m in members)
    return type(None) in members and "none" not in words and not texts


def optional_section(annotation: Any) -> bool:
    """Whether a field holds a section or None (`[init]`, `[lora]`): the kind `--init none` turns off."""
    members = union_members(annotation)
    return type(None) in members and any(isinstance(m, type) and issubclass(m, BaseModel) for m in members)


def tag_of(model: type[BaseModel]) -> str | None:
    """The `type` literal of a discriminated-union variant."""
    field = model.model_fields.get("type")
    if field is not None and typing.get_origin(field.annotation) is Literal:
        return typing.get_args(field.annotation)[0]
    return None


def _type_name(annotation: Any) -> str:
    names = []
    for m in union_members(annotation):
        if m is type(None):
            names.append("none")
        elif typing.get_origin(m) is Literal:
            names.append("{" + ",".join(str(a) for a in typing.get_args(m)) + "}")
        elif typing.get_origin(m) in (list, tuple, dict):
            names.append(typing.get_origin(m).__name__)
        elif isinstance(m, type):
            names.append(m.__name__.lower() if m.__module__ == "builtins" else m.__name__)
        else:
            names.append(str(m))
    return "|".join(names)


def _show(value: Any) -> str:
    return str(value) if isinstance(value, Path) else repr(value)


def field_default(field: Any) -> Any:
    """A field's default value (its factory's, made now); `PydanticUndefined` for a required field."""
    if field.default is not PydanticUndefined:
        return field.default
    return field.default_factory() if field.default_factory is not None else PydanticUndefined


def _default_text(field: Any) -> str:
    value = field_default(field)
    if value is PydanticUndefined:
        return "(required)"
    return "" if isinstance(value, BaseModel) and field.default is PydanticUndefined else _show(value)


def _default_section(field: Any, name: str, parent: BaseModel | None) -> BaseModel | None:
    """The default value of the section `name`: from the parent's default when there is one (a parent's
    default_factory may set other values than the section class's own defaults, e.g. sft's optim.lr)."""
    value = getattr(parent, name) if parent is not None else (
        field.default_factory() if field.default_factory is not None else field.default)
    return value if isinstance(value, BaseModel) else None


def describe(model: type[BaseModel], prefix: str = "", condition: str = "", hide=(), hide_below=(),
             defaults: BaseModel | None = None) -> list[KeyDoc]:
    """Every key of `model`, sections recursed, union variants listed with their condition.

    `hide` names keys left out at this level, `hide_below` keys left out one level down
    (the shared keys `rl` hands to its components). `defaults`: the section's default value,
    whose fields are the defaults shown (None: the fields' own defaults).
    """
    rows: list[KeyDoc] = []
    for name, field in model.model_fields.items():
        if name in hide:
            continue
        key = f"{prefix}{name}"
        description = " ".join((field.description or "").split())  # the whole docstring, on one line
        models = model_types(field.annotation)
        is_list = typing.get_origin(union_members(field.annotation)[0]) in (list, tuple)
        if models and not is_list and len(models) == 1:
            rows.append(KeyDoc(key, "section", "", description, condition, is_section=True))
            rows += describe(models[0], f"{key}.", condition, hide=hide_below,
                             defaults=_default_section(field, name, defaults))
        elif models and not is_list:
            tags = ",".join(t for m in models if (t := tag_of(m)))
            rows.append(KeyDoc(f"{key}.type", f"{{{tags}}}", "", description, condition))
            default = _default_section(field, name, defaults)
            per_variant = [[row for row in describe(variant, f"{key}.", f"{key}.type={tag_of(variant)}",
                                                    defaults=default if type(default) is variant else None)
                            if row.key != f"{key}.type"] for variant in models]
            rows += _shared_once(per_variant, condition)
        else:
            type_text = (f"list of {'|'.join(m.__name__ for m in models)} tables" if models
                         else _type_name(field.annotation))
            shown = _default_text(field) if defaults is None else _show(getattr(defaults, name))
            rows.append(KeyDoc(key, type_text, shown, description, condition))
    return rows


def _shared_once(per_variant: list[list[KeyDoc]], condition: str) -> list[KeyDoc]:
    """The rows of a union's variants, a key that every variant has alike (type, default, description: e.g. the
    `[loss.correction]` keys every loss type takes) listed once, first and under the union's own condition, the
    others under their variant's."""
    def alike(row: KeyDoc) -> tuple:
        return row.key, row.type, row.default, row.description, row.is_section

    shared = set.intersection(*({alike(r) for r in rows} for rows in per_variant)) if len(per_variant) > 1 else set()
    once = [replace(r, condition=condition) for r in per_variant[0] if alike(r) in shared]
    return once + [r for rows in per_variant for r in rows if alike(r) not in shared]


def describe_config(config_cls: type[BaseModel]) -> list[KeyDoc]:
    """The keys of an entrypoint config, leaving out shared keys inside its components."""
    return describe(config_cls, hide_below=getattr(config_cls, "help_hidden", ()))

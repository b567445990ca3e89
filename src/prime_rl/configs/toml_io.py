"""Reading, merging and writing TOML config files."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from prime_rl.utils.errors import ConfigError
from prime_rl.utils.fs import atomic_write_text

INCLUDE_KEY = "include"


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file; a missing, unreadable, non-UTF-8 or malformed file is a `ConfigError` naming it.

    A top-level `include = "base.toml"` (or a list of files, paths relative to this file)
    is read first and this file's values are merged over them, so a variant config can
    state only what it changes.
    """
    merged: dict[str, Any] = {}
    for _, values in read_toml_layers(path):
        merged = deep_merge(merged, values)
    return merged


def read_toml_layers(path: Path, _seen: tuple[Path, ...] = ()) -> list[tuple[Path, dict[str, Any]]]:
    """The files `path` is made of, in the order `read_toml` merges them: each file it includes (the files those
    include first), then `path` itself; each with its own values only (without `include`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in _seen:
        raise ConfigError(f"config file {path} includes itself (through {' -> '.join(map(str, _seen))})")
    data = _parse(path)
    includes = data.pop(INCLUDE_KEY, [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"config file {path}: '{INCLUDE_KEY}' must be a file name or a list of file names")
    layers = [layer for name in includes for layer in read_toml_layers(path.parent / name, (*_seen, path.resolve()))]
    return [*layers, (path, data)]


def _parse(path: Path) -> dict[str, Any]:
    """The TOML table in `path`; unreadable bytes, non-UTF-8 text and bad TOML are one-line errors."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}); TOML files must be UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return `base` updated by `override`, recursing into tables (override wins)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _drop_none(value: Any) -> Any:
    """TOML has no null: a key whose value is None is left out (it then takes its default)."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def dump_toml(data: dict[str, Any]) -> str:
    """Serialise a config dict (as from `model_dump(mode="json")`) to TOML text."""
    return tomli_w.dumps(_drop_none(data))


def write_toml(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(Path(path), dump_toml(data))

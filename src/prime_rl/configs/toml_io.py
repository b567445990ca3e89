"""Reading, merging and writing TOML config files."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from prime_rl.utils.errors import ConfigError
from prime_rl.utils.fs import atomic_write_text


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file; a missing or malformed file is a `ConfigError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
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

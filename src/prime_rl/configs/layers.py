"""The layers a config is built from, one by one, for the rules the merged config can no longer see.

The merged config says what a key is, not who set it. A rule such as "a model named on the command line
wins over the file's [init]" (`EntrypointConfig.settle_layers`) needs the layers themselves, lowest
precedence first: each TOML file (each file it includes before it), the `PRIME_*` variables, the command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic_settings import BaseSettings, EnvSettingsSource

from prime_rl.configs.env_vars import env_name
from prime_rl.configs.toml_io import read_toml_layers

_UNSET = object()


class Layer(NamedTuple):
    """The values one source sets: a TOML file, the `PRIME_*` variables or the command line."""

    kind: Literal["file", "env", "cli"]
    where: str
    """Where the values come from, as the words after "from": a file's path, "the command line"."""
    values: dict[str, Any]

    def get(self, dotted: str) -> Any:
        """The value this layer gives `dotted` (a key such as `model.name`), or `_UNSET`."""
        node: Any = self.values
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return _UNSET
            node = node[part]
        return node

    def sets(self, dotted: str) -> bool:
        return self.get(dotted) is not _UNSET

    def spell(self, dotted: str) -> str:
        """The key with its value as this layer gives it: `--model.name DIR`, `PRIME_MODEL__NAME=DIR`,
        `model.name = 'DIR' in a.toml`."""
        value = self.get(dotted)
        if self.kind == "cli":
            return f"--{dotted} {value}"
        if self.kind == "env":
            return f"{env_name(dotted)}={value}"
        return f"{dotted} = {value!r} in {self.where}"


def config_layers(config_cls: type[BaseSettings], toml_files: Sequence[Path],
                  overrides: dict[str, Any]) -> list[Layer]:
    """The layers `config_cls.build(toml_files, overrides)` merges, lowest precedence first (`config_cls`: an
    `EntrypointConfig`, whose `settle_layers` rules read them; this module does not import it, so the base class
    can name `Layer`)."""
    layers = [Layer("file", str(path), values) for file in toml_files for path, values in read_toml_layers(file)]
    layers.append(Layer("env", "the PRIME_* variables", EnvSettingsSource(config_cls)()))
    layers.append(Layer("cli", "the command line", overrides))
    return layers

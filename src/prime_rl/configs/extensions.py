"""`Registry`: one per extension point, mapping a name to its config class and its implementation.

The extension points and where each side is registered:

    registry                          config classes                 implementations
    configs.loss.LOSSES               configs/loss.py                trainer/rl/losses/
    configs.advantage.ADVANTAGES      configs/advantage.py           advantages/ (group.py, token.py)
    inference.config.BACKENDS         inference/config.py            inference/backends.py
    envs.registry.ENVIRONMENTS        the Environment class is both (its keyword arguments are the TOML `args`)

A config class registers with `@REGISTRY.config`, under the default of its `type` field (the
TOML value that selects it) or, for a section without one, its `name` class attribute. Its
implementation registers with `@REGISTRY.implements(ConfigClass, ...)` in the module that
holds it (a component's, or `advantages/`, which both RL processes import); `configs/` stays a
base layer that imports no component, so the registry imports the implementing module or package
(`implemented_in`) the first time an implementation is asked for.
The config union (`union()`) and the choices (`names`) come from the registry, and
`drift()` names every config without an implementation (a test runs it on every registry).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Generic, TypeVar, Union

from pydantic import BaseModel, BeforeValidator, Field

Impl = TypeVar("Impl")
C = TypeVar("C", bound=type[BaseModel])


def same_definition(a: object, b: object) -> bool:
    """True when `a` and `b` are the same class or function, or one definition run twice (a module
    re-imported after it failed half-way, or reloaded): a registry may replace such an entry."""
    return a is b or (getattr(a, "__module__", None) == getattr(b, "__module__", None)
                      and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None))


def registered_name(config_cls: type[BaseModel]) -> str:
    """The name a config class registers under: its `type` field's default, else its `name` attribute."""
    field = config_cls.model_fields.get("type")
    name = field.default if field is not None else getattr(config_cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{config_cls.__name__} needs a `type` field with a default or a `name` class attribute")
    return name


class Registry(Generic[Impl]):
    """name -> (config class, implementation) for one extension point (see the module docstring)."""

    def __init__(self, kind: str, implemented_in: str, default: str | None = None):
        self.kind = kind
        self.implemented_in = implemented_in
        self.default = default
        """The name a section without `type` selects (the section's own default type), so `[loss] kl_coef = 0.1`
        alone means the default loss with that key, not an error about a missing tag."""
        self.configs: dict[str, type[BaseModel]] = {}
        self._implementations: dict[str, Impl] = {}
        self._union_built = False

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.configs)

    def config(self, config_cls: C) -> C:
        """Class decorator: register a config class under its name (a name is registered once), before the
        union is built."""
        name = registered_name(config_cls)
        if name in self.configs and not same_definition(self.configs[name], config_cls):
            raise ValueError(f"{self.kind} '{name}' is registered twice ({self.configs[name].__name__}, "
                             f"{config_cls.__name__})")
        if self._union_built and name not in self.configs:
            raise ValueError(f"{self.kind} '{name}' is registered after its config union was built")
        self.configs[name] = config_cls
        return config_cls

    def implements(self, *config_classes: type[BaseModel]) -> Callable[[Impl], Impl]:
        """Decorator: register the decorated object as the implementation of these config classes."""

        def register(implementation: Impl) -> Impl:
            for config_cls in config_classes:
                name = registered_name(config_cls)
                if self.configs.get(name) is not config_cls:
                    raise ValueError(f"{config_cls.__name__} is not a registered {self.kind} config")
                if name in self._implementations and not same_definition(self._implementations[name], implementation):
                    raise ValueError(f"{self.kind} '{name}' has two implementations")
                self._implementations[name] = implementation
            return implementation

        return register

    def implementation(self, name: str) -> Impl:
        """The implementation registered for `name` (importing `implemented_in` registers them)."""
        importlib.import_module(self.implemented_in)
        try:
            return self._implementations[name]
        except KeyError:
            if name in self.configs:
                raise ValueError(f"{self.kind} '{name}' has a config but no implementation: the module that registers "
                                 f"it must be imported by {self.implemented_in}") from None
            raise ValueError(f"unknown {self.kind} '{name}' (known: {', '.join(self.names)})") from None

    def union(self) -> Any:
        """The pydantic type of a config section of this kind: the registered classes, told apart by `type` (a
        section without one: `default`'s)."""
        self._union_built = True
        union = Annotated[Union[tuple(self.configs.values())], Field(discriminator="type")]  # noqa: UP007
        if self.default is None:
            return union
        default = self.default

        def default_type(value: Any) -> Any:
            return {"type": default, **value} if isinstance(value, dict) and "type" not in value else value

        return Annotated[union, BeforeValidator(default_type)]

    def unregister(self, name: str) -> None:
        """Remove `name`'s config class and implementation (an extension registered for a while, such as a test's).
        What was built from the registry meanwhile (a config union, the backend choices) is not rebuilt."""
        if name not in self.configs:
            raise ValueError(f"{self.kind} '{name}' is not registered")
        del self.configs[name]
        self._implementations.pop(name, None)

    @contextmanager
    def scoped(self) -> Iterator[None]:
        """Every name registered inside the block is unregistered when it ends, so a test's extension (registered by
        importing its module, say) leaves the registry as it found it."""
        before = set(self.configs)
        try:
            yield
        finally:
            for name in [name for name in self.configs if name not in before]:
                self.unregister(name)

    def drift(self) -> list[str]:
        """The names with a config and no implementation (empty: the two sides agree; the reverse cannot
        happen, `implements` refuses a class that is not registered)."""
        importlib.import_module(self.implemented_in)
        return [f"{self.kind} '{name}' has a config and no implementation"
                for name in self.configs if name not in self._implementations]

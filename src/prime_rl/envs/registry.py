"""The environment registry: id -> class, and `load_env(id, **args)`.

An environment class is its own config and implementation: its `id` is the name, its
keyword constructor arguments are the TOML `args` table. Add a built-in by writing an
`Environment` subclass in this package with `@register_env` (and importing its module in
`__init__.py`). Your own class needs no registration: name it by import path,
`id = "my_pkg.envs:MyEnv"`.
"""

from __future__ import annotations

import inspect
from typing import Any

from prime_rl.configs.extensions import same_definition
from prime_rl.envs.environment import Environment
from prime_rl.envs.verifiers_env import load_verifiers_env
from prime_rl.utils.errors import UserError
from prime_rl.utils.imports import import_object

ENVIRONMENTS: dict[str, type[Environment]] = {}
"""The built-in environments by id (filled by `@register_env` when `prime_rl.envs` is imported)."""


def register_env(cls: type[Environment]) -> type[Environment]:
    """Class decorator: register an environment class under its `id`. An id belongs to one class; the same
    class defined again (its module re-imported or reloaded) replaces its earlier self."""
    if not getattr(cls, "id", None):
        raise ValueError(f"{cls.__name__} needs a class attribute 'id'")
    if not same_definition(ENVIRONMENTS.get(cls.id, cls), cls):
        raise ValueError(f"environment '{cls.id}' is registered twice "
                         f"({ENVIRONMENTS[cls.id].__name__}, {cls.__name__})")
    ENVIRONMENTS[cls.id] = cls
    return cls


def _check_args(cls: type[Environment], env_id: str, args: dict[str, Any]) -> None:
    """Unknown argument names and wrong types are user errors naming the allowed arguments."""
    params = inspect.signature(cls.__init__).parameters
    allowed = {name: p for name, p in params.items() if name != "self" and p.kind is not p.VAR_POSITIONAL}
    if any(p.kind is p.VAR_KEYWORD for p in allowed.values()):
        return
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise UserError(
            f"environment '{env_id}' has no argument(s) {', '.join(unknown)} (allowed: {', '.join(allowed) or 'none'})"
        )
    for name, value in args.items():
        default = allowed[name].default
        if default is inspect.Parameter.empty or default is None:
            continue
        expected = float if isinstance(default, float) else type(default)
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise UserError(
                f"environment '{env_id}' argument '{name}' must be {expected.__name__}, got {value!r}"
            )


def import_env_class(import_path: str) -> type[Environment]:
    """'pkg.module:Class' -> the Environment subclass; UserError otherwise."""
    try:
        cls = import_object(import_path)  # the same import rules as custom losses and advantages
    except ValueError as exc:
        raise UserError(f"environment {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UserError(f"environment import path {import_path!r} does not name an Environment subclass")
    return cls


def load_env(env_id: str, **args: Any) -> Environment:
    """Build the environment `env_id` with `args`: a built-in, a class by import path ('pkg.mod:Class'),
    else a `verifiers` environment if installed."""
    cls = import_env_class(env_id) if ":" in env_id else ENVIRONMENTS.get(env_id)
    if cls is not None:
        _check_args(cls, env_id, args)
        env = cls(**args)
        if ":" in env_id:
            env.id = getattr(cls, "id", None) or env_id
        return env
    env = load_verifiers_env(env_id, args)
    if env is None:
        raise UserError(
            f"unknown environment '{env_id}' (known: {', '.join(sorted(ENVIRONMENTS))}; "
            "other ids need the 'verifiers' extra installed)"
        )
    return env

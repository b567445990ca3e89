"""The environment registry: id -> class, and `load_env(id, **args)`.

Add a built-in by writing an `Environment` subclass with an `id` and keyword
constructor arguments (the TOML `args` table), then listing it in `ENVIRONMENTS`.
Your own environment class can also be named by import path, `id = "my_pkg.envs:MyEnv"`,
without touching this package.
"""

from __future__ import annotations

import inspect
from typing import Any

from prime_rl.configs.loss import import_loss_function
from prime_rl.orchestrator.envs.alphabet_sort import AlphabetSortEnv
from prime_rl.orchestrator.envs.arithmetic import ArithmeticEnv
from prime_rl.orchestrator.envs.base import Environment
from prime_rl.orchestrator.envs.reverse_text import ReverseTextEnv
from prime_rl.orchestrator.envs.verifiers_env import load_verifiers_env
from prime_rl.utils.errors import UserError

ENVIRONMENTS: dict[str, type[Environment]] = {cls.id: cls for cls in (ReverseTextEnv, AlphabetSortEnv, ArithmeticEnv)}


def register_env(cls: type[Environment]) -> type[Environment]:
    """Register an environment class under its `id` (usable as a decorator)."""
    if not getattr(cls, "id", None):
        raise ValueError(f"{cls.__name__} needs a class attribute 'id'")
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
        cls = import_loss_function(import_path)  # the same import rules as custom losses and advantages
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

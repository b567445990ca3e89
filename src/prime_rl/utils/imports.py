"""`import_object("pkg.module:attr")`: the one way prime-rl imports user code named in a config.

Used for custom losses, custom advantages, environment classes and agent functions. The module is a module
name on the import path (`pkg.module`) or a Python file (`path/to/file.py`, relative to the working directory:
`examples/agent/openai_loop.py:run` needs no PYTHONPATH). A path is resolved once per process (cached), so a
config validator that checks it and the code that calls it share one import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def _module_from_file(path: str) -> ModuleType:
    """The module of Python file `path`, imported once per process under a name made from its resolved path (two
    files of one name stay apart)."""
    file = Path(path).resolve()
    name = "prime_rl_user." + "_".join(file.with_suffix("").parts[1:]).replace(".", "_").replace("-", "_")
    if name in sys.modules:
        return sys.modules[name]
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@functools.cache
def import_object(import_path: str) -> Any:
    """The attribute `attr` of module `pkg.module` named by 'pkg.module:attr' (or 'pkg.module.attr').

    A ValueError naming the path when it is malformed, its module fails to import (whatever the
    module raised), or the module has no such attribute. Failures are not cached.
    """
    if ":" in import_path:
        module_name, _, attr = import_path.partition(":")
    else:
        module_name, _, attr = import_path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"import path {import_path!r} must look like 'pkg.module:name' or 'pkg.module.name'")
    try:
        module = _module_from_file(module_name) if module_name.endswith(".py") else importlib.import_module(
            module_name)
    except Exception as exc:  # an ImportError or whatever the module raises on import
        raise ValueError(f"cannot import module {module_name!r} of {import_path!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no {attr!r} ({import_path!r})") from None


def import_callable(import_path: str) -> Any:
    """`import_object` that must give a callable (a function or a class)."""
    obj = import_object(import_path)
    if not callable(obj):
        raise ValueError(f"{import_path!r} is not a function or class (it is of type {type(obj).__name__})")
    return obj

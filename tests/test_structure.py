"""The structure rules of DEVELOPERS.md, checked on the source: who may spell run-directory names,
which layers may import which, and that every extension registry's two sides agree."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import get_args

import pytest
from pydantic import TypeAdapter

import prime_rl.envs
from prime_rl import run_dir
from prime_rl.configs.advantage import ADVANTAGES, AdvantageConfig
from prime_rl.configs.loss import LOSSES, LossConfig
from prime_rl.envs import ENVIRONMENTS, Environment
from prime_rl.inference.config import BACKENDS, InferenceConfig
from tests.support import REPO

SRC = REPO / "src" / "prime_rl"
COMPONENTS = ("inference", "orchestrator", "trainer", "launch", "envs", "monitor")


def modules(folder: Path = SRC):
    for path in sorted(folder.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def imported(tree: ast.AST) -> set[str]:
    """Every prime_rl module a file imports (`from prime_rl.x import y` counts as prime_rl.x)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prime_rl"):
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("prime_rl"))
    return names


def test_only_run_dir_spells_run_directory_names():
    names = {run_dir.CONFIGS, run_dir.ROLLOUTS, run_dir.WEIGHTS, run_dir.CHECKPOINTS, run_dir.LOGS, run_dir.METRICS,
             run_dir.METRICS_PLOT, run_dir.MARKER, run_dir.RUN_LOCK, run_dir.NODES, run_dir.SLURM}
    found = [f"{path.relative_to(SRC)}:{node.lineno} {node.value!r}"
             for path, tree in modules() if path.name != "run_dir.py"
             for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names]
    assert not found, f"run-directory names outside run_dir.py: {found}"


def test_configs_is_a_base_layer():
    upward = {f"{path.relative_to(SRC)} imports {name}"
              for path, tree in modules(SRC / "configs") for name in imported(tree)
              if name.split(".")[1] in COMPONENTS}
    assert not upward


@pytest.mark.parametrize("component", ["orchestrator", "trainer", "inference"])
def test_launcher_imports_only_component_configs(component):
    internals = {f"{path.relative_to(SRC)} imports {name}"
                 for path, tree in modules(SRC / "launch") for name in imported(tree)
                 if name.startswith(f"prime_rl.{component}") and not name.endswith(".config")}
    assert not internals


def test_no_component_imports_the_launcher():
    users = {f"{path.relative_to(SRC)} imports {name}"
             for path, tree in modules() if "launch" not in path.parts
             for name in imported(tree) if name.startswith("prime_rl.launch")}
    assert not users


@pytest.mark.parametrize("registry", [LOSSES, ADVANTAGES, BACKENDS], ids=lambda r: r.kind)
def test_every_registered_config_has_an_implementation(registry):
    assert registry.drift() == []
    for name in registry.names:
        assert callable(registry.implementation(name))


@pytest.mark.parametrize("registry", [LOSSES, ADVANTAGES, BACKENDS], ids=lambda r: r.kind)
def test_implementations_are_not_in_an_entrypoint_module(registry):
    # `python -m <module>` runs an entrypoint as __main__; the registry importing it by name would then
    # load it a second time and register every implementation twice.
    source = (SRC.parent / (registry.implemented_in.replace(".", "/") + ".py")).read_text()
    assert "__main__" not in source


@pytest.mark.parametrize(("union", "registry"), [(LossConfig, LOSSES), (AdvantageConfig, ADVANTAGES)])
def test_config_unions_are_the_registered_classes(union, registry):
    members = get_args(get_args(union)[0])
    assert members == tuple(registry.configs.values())
    adapter = TypeAdapter(union)
    for name, cls in registry.configs.items():
        required = {"import_path": "math:sqrt"} if name == "custom" else {}
        assert type(adapter.validate_python({"type": name, **required})) is cls


def test_backend_choices_are_the_registered_backends():
    assert get_args(InferenceConfig.model_fields["backend"].annotation) == (*BACKENDS.names, "auto")
    for name in BACKENDS.names:  # each backend has its options section
        assert type(getattr(InferenceConfig(), name)) is BACKENDS.configs[name]


def test_every_environment_class_in_the_package_is_registered_under_its_id():
    # A built-in needs @register_env and its module imported in envs/__init__.py; either missing fails here.
    defined = {}
    for module_info in pkgutil.iter_modules(prime_rl.envs.__path__):
        module = importlib.import_module(f"prime_rl.envs.{module_info.name}")
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, Environment) and obj.__module__ == module.__name__
                    and not inspect.isabstract(obj) and getattr(obj, "id", None)):
                defined[obj.id] = obj
    assert defined and defined == ENVIRONMENTS

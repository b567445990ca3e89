"""The structure rules of DEVELOPERS.md, checked on the source: who may spell run-directory names,
which layers may import which, and that every extension registry's two sides agree."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
import tomllib
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


def module_name(path: Path, src: Path) -> str:
    """`prime_rl.a.b` of src/prime_rl/a/b.py; a package's `__init__.py` is the package itself."""
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Every prime_rl module under `src` and the prime_rl modules it imports, wherever the import stands: at the
    top, under `if TYPE_CHECKING:` or inside a function (a circle that only the type checker or a late import
    sees is still a circle in the design). `from prime_rl.a import b` is an edge to `prime_rl.a.b` when that is a
    module, else to `prime_rl.a` (a package: its `__init__`). Not edges: a submodule's implicit import of its
    package's `__init__`, and imports by name at run time (a registry's `implemented_in`, `import_object`)."""
    paths = {module_name(path, src): path for path in sorted(src.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == src.name:
                edges.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths else node.module
                             for alias in node.names)
            elif isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in paths)
        graph[name] = (edges & paths.keys()) - {name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The sets of modules that import each other, directly or through others (components of 2+ modules)."""
    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reach = {name: reachable(name) for name in graph}
    return {frozenset({name} | {other for other in reach[name] if name in reach[other]})
            for name in graph if name in reach[name]}


ALLOWED_CIRCLES: dict[frozenset[str], str] = {}
"""Import circles that cannot be avoided, each with its reason (none today). Every one found must be listed here,
and every one listed must still exist."""


def test_no_import_circles_among_prime_rl_modules():
    # One owner per concept: two modules that need each other are one concept split in two, or share a third one
    # that belongs in a module of its own (the orchestrator's draws and environment calls, `env_calls.py`, are such).
    graph = import_graph()
    found = import_circles(graph)
    report = ["; ".join(f"{a} -> {b}" for a in sorted(c) for b in sorted(graph[a] & c)) for c in found]
    assert found == set(ALLOWED_CIRCLES), f"import circles: {report}"


def test_the_circle_check_sees_imports_under_type_checking_and_in_functions(tmp_path):
    # The two circles of the orchestrator this check removed were of these kinds: it must keep seeing them.
    package = tmp_path / "prime_rl"
    (package / "sub").mkdir(parents=True)
    for path, text in {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from prime_rl.b import B\n",
        "b.py": "from prime_rl import a\n",
        "c.py": "def f():\n    import prime_rl.sub.d\n",
        "sub/__init__.py": "",
        "sub/d.py": "from prime_rl.c import f\n",
        "e.py": "from prime_rl.sub import d\n",  # one way only: no circle
    }.items():
        (package / path).write_text(text)
    found = import_circles(import_graph(package))
    assert found == {frozenset({"prime_rl.a", "prime_rl.b"}), frozenset({"prime_rl.c", "prime_rl.sub.d"})}


@pytest.mark.slow
def test_only_run_dir_spells_run_directory_names():
    names = {run_dir.CONFIGS, run_dir.ROLLOUTS, run_dir.WEIGHTS, run_dir.CHECKPOINTS, run_dir.LOGS, run_dir.METRICS,
             run_dir.METRICS_PLOT, run_dir.MARKER, run_dir.RUN_LOCK, run_dir.NODES, run_dir.SLURM,
             run_dir.TRANSFER_MARKER, run_dir.TRAINER_META, run_dir.SLURM_SCRIPT, run_dir.SLURM_CONFIG}
    # Not ORCHESTRATOR_STATE: "state.json" is also a file of a Hugging Face data set saved to disk (`envs/data_files`).
    found = [f"{path.relative_to(SRC)}:{node.lineno} {node.value!r}"
             for path, tree in modules() if path.name != "run_dir.py"
             for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value in names]
    assert not found, f"run-directory names outside run_dir.py: {found}"


def test_utils_holds_leaf_helpers_only():
    # utils/ is the ground floor: every other layer may use it, so it may use nothing of prime_rl but itself (a
    # helper that needs the run directory, a model or a chat belongs with those).
    upward = {f"{path.relative_to(SRC)} imports {name}"
              for path, tree in modules(SRC / "utils") for name in imported(tree)
              if not name.startswith("prime_rl.utils")}
    assert not upward


SHARED_FILE_NAMES = {"__init__.py", "config.py", "train.py", "loss.py"}
"""File names several folders may use: the per-component conventions (each component's config, each trainer's
loop), and `loss.py`: the `[loss]` config (`configs/loss.py`) and the trainer's entry to the loss package
(`trainer/rl/loss.py`), the two halves of one concern, each where its layer keeps such things."""


def test_no_two_modules_share_a_file_name():
    # A search for `weights.py` or `ckpt` must find one thing: files that hold different things have names that
    # say which (`trainer_ckpt.py`, `orchestrator_ckpt.py`).
    by_name: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        by_name.setdefault(path.name, []).append(str(path.relative_to(SRC)))
    shared = {name: sorted(paths) for name, paths in by_name.items()
              if len(paths) > 1 and name not in SHARED_FILE_NAMES}
    assert not shared


def validator_functions(tree: ast.AST):
    """The functions of a module that validate a config: pydantic's field and model validators, and the rules
    across keys (`check_consistency`, the `_check_*` helpers it calls)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        decorators = {(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
        names = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", "") for d in decorators}
        if names & {"field_validator", "model_validator"} or node.name == "check_consistency" \
                or node.name.startswith("_check"):
            yield node


def assignments(function: ast.FunctionDef) -> list[int]:
    """Lines where `function` assigns to an attribute (`self.x = ...`, `self.a.b[k] = ...`) or calls setattr."""
    lines = []
    for node in ast.walk(function):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else []
        if any(isinstance(t, ast.Attribute) or isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute)
               for t in targets):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__"):
            lines.append(node.lineno)
    return lines


def test_no_validator_assigns():
    # Validation checks; what follows from other values is derived afterwards, on a copy (`configs.base.with_values`,
    # `EntrypointConfig.derived`, `plan_run`), so a new key has one place to be filled in.
    found = [f"{path.relative_to(SRC)}:{line} in {function.name}" for path, tree in modules()
             for function in validator_functions(tree) for line in assignments(function)]
    assert not found


def test_the_validator_check_sees_assignments():
    tree = ast.parse("class C:\n    def check_consistency(self):\n        self.a.b = 1\n"
                     "    @model_validator(mode='after')\n    def v(self):\n        object.__setattr__(self, 'a', 1)\n"
                     "    def derived(self):\n        self.a = 2\n")
    assert [line for function in validator_functions(tree) for line in assignments(function)] == [3, 6]


def test_nothing_bypasses_a_configs_validation():
    found = [f"{path.relative_to(SRC)}:{node.lineno}" for path, tree in modules() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__"]
    assert not found


def test_the_training_session_knows_no_rl():
    # `TrainSession` is what `sft` and the RL trainer share: the RL loop hands it what only RL has (a critic, the
    # sampled vocabulary, the transfer group) instead of the session probing its config for them.
    path = SRC / "trainer" / "session.py"
    tree = ast.parse(path.read_text())
    rl = {name for name in imported(tree) if name.startswith(("prime_rl.trainer.rl", "prime_rl.configs.advantage"))
          or name in ("prime_rl.trainer.value_head",)}
    probes = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) in
              ("getattr", "hasattr", "isinstance")]
    assert not rl and not probes


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


@pytest.mark.parametrize(("importer", "imported_component"), [("trainer", "orchestrator"), ("orchestrator", "trainer")])
def test_the_trainer_and_the_orchestrator_never_import_each_other(importer, imported_component):
    # Two processes that share only files: what both need (the advantages' math) lives in a layer below them.
    internals = {f"{path.relative_to(SRC)} imports {name}"
                 for path, tree in modules(SRC / importer) for name in imported(tree)
                 if name.split(".")[1:2] == [imported_component]}
    assert not internals


@pytest.mark.parametrize("layer", ["advantages", "openai_api"])
def test_a_layer_below_the_components_imports_none(layer):
    # advantages: imported by the orchestrator and the trainer alike; openai_api: by the inference server and the
    # orchestrator's agent gateway. So neither may import those (or any other component).
    found = list(modules(SRC / layer))
    upward = {f"{path.relative_to(SRC)} imports {name}" for path, tree in found for name in imported(tree)
              if name.split(".")[1:2] and name.split(".")[1] in COMPONENTS}
    assert found and not upward


def test_the_orchestrator_imports_of_the_server_and_the_trainer_their_configs_only():
    # The agent gateway answers as the server does through the shared layer `openai_api`, not the server's modules.
    internals = {f"{path.relative_to(SRC)} imports {name}"
                 for path, tree in modules(SRC / "orchestrator") for name in imported(tree)
                 if name.split(".")[1:2] in (["inference"], ["trainer"]) and name.split(".")[-1] != "config"}
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
    # load it a second time and register every implementation twice. `implemented_in` is a module or a package.
    path = SRC.parent / registry.implemented_in.replace(".", "/")
    sources = ([f.read_text() for f in sorted(path.rglob("*.py"))] if path.is_dir()
               else [path.with_suffix(".py").read_text()])
    assert sources and not any("__main__" in source for source in sources)


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


def dry_run_args(example: Path) -> list[str]:
    """`rl` arguments that dry-run `example`, a model it names under outputs/ (made by an earlier command of its
    README) replaced by the embedded model."""
    config = tomllib.loads(example.read_text())
    args = ["@", str(example), "--dry-run"]
    for section, key in ((config, "--model.name"), (config.get("teacher", {}), "--teacher.model.name")):
        if section.get("model", {}).get("name", "").startswith("outputs/"):
            args += [key, "tiny-reverse-text"]
    return args


@pytest.mark.slow
def test_configs_and_the_launcher_import_no_torch():
    """Every `rl` start, `--help` and `--dry-run` would pay torch's import (~2.5 s, 6 s on a slow day) before any
    process starts: the launcher, every config module and a dry run of each example import no torch (nor
    transformers), on a machine without a GPU driver as on this one. Not the examples with a `[teacher]`: their
    config check compares the two models' tokenizers, which transformers loads."""
    configs = sorted(module_name(path, SRC) for path in SRC.rglob("*.py")
                     if path.parent.name == "configs" or path.name == "config.py")
    runs = [dry_run_args(example) for example in sorted((REPO / "examples").glob("*/rl*.toml"))
            if "teacher" not in tomllib.loads(example.read_text())]
    assert len(runs) >= 10, runs
    script = (
        "import contextlib, io, sys\n"
        f"import prime_rl.launch.rl, prime_rl.launch.plan, prime_rl.launch.slurm, {', '.join(configs)}\n"
        f"for args in {runs!r}:\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(io.StringIO()):\n"
        "            prime_rl.launch.rl.main(args)\n"
        "    except SystemExit as exit:\n"
        "        assert not exit.code, args\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-2000:]

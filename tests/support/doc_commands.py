"""The shell commands of the docs, run as far as a test can run them (tests/test_docs_snippets.py).

`DocShell` runs the lines of one block, in order, in a sandbox that stands for the repository root: the repository's
files linked in and the files a page assumes the reader has (`make_sandbox`). `VAR=value` prefixes, `export`, `$VAR`,
`$(...)` and `&&` work as in a shell; placeholders a reader fills in (`<task>`, `<model dir>`, `DIR`) are filled with
`PLACEHOLDERS`. How each program runs:

- prime-rl's commands (`rl`, `sft`, `trainer`, `orchestrator`, `inference`, `eval`, also as `python -m <module>`
  and under `torchrun ... -m <module>`): in this process with `--dry-run` appended, which loads and checks the whole
  config (unknown keys and flags, missing files, wrong values) and starts nothing; it must exit 0. An absolute
  `--output-dir` is moved into the sandbox.
- `pytest ARGS`: pytest's own parser knows every option, the test files named exist, the `-m` markers are registered.
- `python script.py ARGS`, `python -m module ARGS`: run in this process until its argparse parser has parsed ARGS,
  then stopped; one without a parser would do its work, so it is only compiled.
- `bash script.sh`: the script exists and `bash -n` parses it.
- `prime-rl view ...` (the rollout viewer): run until its parser has parsed the arguments.
- what cannot run in a test (installs, the network, a cluster, another checkout: `NOT_HERE`) is not run and is
  returned as `NotHere`; the block must be fenced ```bash partial. Checked even so: the extras such a command names
  exist and the versions it pins are pyproject.toml's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from prime_rl.configs.cli import build_config
from prime_rl.launch.plan import plan_run, prepare_run_dir
from prime_rl.launch.rl_config import RLConfig
from tests.support import REPO
from tests.support.entrypoints import MAINS, run_entrypoint

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
PINS = {req.name: req for req in map(Requirement, [*PYPROJECT["project"]["dependencies"],
                                                     *PYPROJECT["dependency-groups"]["dev"],
                                                     *sum(PYPROJECT["project"]["optional-dependencies"].values(), [])])}
MODULES = {target.split(":")[0]: command for command, target in MAINS.items()}
"""prime-rl's commands by module: `python -m prime_rl.launch.rl` is `rl`."""

NOT_HERE = {
    "pip": "changes or inspects an installed environment", "uv sync": "installs packages",
    "uv venv": "makes a virtual environment",
    "git": "clones over the network", "cd": "moves to another checkout (the sandbox stands for it)",
    "sbatch": "submits to a SLURM cluster", "srun": "runs on a SLURM cluster", "wandb": "talks to W&B's servers",
    "curl": "talks to a running server", "nvidia-smi": "needs a GPU",
}
"""Programs a test cannot run, and why."""

MODEL = "outputs/reverse-text-student/weights/step_300"
"""A model directory in the sandbox: where sft_student.toml writes its student (`PRODUCTS`)."""
PLACEHOLDERS = {"<task>": "reverse_text", "<model dir>": MODEL, "DIR": MODEL, "<name>": "tiny-reverse-text",
                "<this repo>": "https://example.invalid/prime-rl.git"}
"""What the test fills in for the names a page leaves to the reader (`DIR` as a whole word)."""
PRODUCTS = {
    "outputs/reverse_text_teacher/weights/step_120": "rl @ examples/reverse_text/rl_teacher.toml",
    MODEL: "sft @ examples/reverse_text/sft_student.toml",
    "outputs/alphabet-sort-sft/weights/step_200": "sft @ examples/alphabet_sort/sft.toml",
    "outputs/code-sft/weights/step_100": "sft @ examples/code/sft.toml",
    "outputs/reasoning-gym-sft/weights/step_150": "sft @ examples/reasoning_gym/sft.toml",
}
"""Model directories that an earlier command of a page trains (the command), for the commands after it (the teacher
of rl_opd.toml, the student of rl_student.toml, the SFT model of alphabet_sort/rl.toml): the embedded model stands in
for them (and the SFT model of code/rl.toml)."""
LINKED = ["benchmarks", "docs", "examples", "pyproject.toml", "scripts", "src", "tests"]


class CommandFailed(AssertionError):
    """A docs command that does not run as written; the message says which and why."""


@dataclass(frozen=True)
class NotHere:
    """A command a test cannot run, and why."""

    why: str


def make_sandbox(root: Path) -> Path:
    """`root` made a stand-in for the repository root: its files linked in; the models of `PRODUCTS`; `base.toml`
    and `run.toml` (the reverse-text example), `override.toml`; what `rl @ run.toml --output-dir outputs/run`
    writes to `outputs/run/configs/` before it starts anything, also as `inference.toml` and `orchestrator.toml`."""
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    for product in PRODUCTS:
        (root / product).parent.mkdir(parents=True)
        (root / product).symlink_to(REPO / "src/prime_rl/assets/tiny-reverse-text")
    for name in ("base.toml", "run.toml"):
        (root / name).write_text('include = "examples/reverse_text/rl.toml"\n')
    (root / "override.toml").write_text("max_steps = 5\n")
    with contextlib.chdir(root), contextlib.redirect_stderr(io.StringIO()):
        config, _ = build_config(RLConfig, ["@", "run.toml", "--output-dir", "outputs/run"])
        prepare_run_dir(plan_run(config)).release()
    for name in ("inference", "orchestrator"):
        (root / f"{name}.toml").write_text((root / f"outputs/run/configs/{name}.toml").read_text())
    return root


class DocShell:
    """Runs the shell lines of one docs block in `sandbox` (see the module docstring); `pytest_parser` parses the
    arguments of a `pytest` command (the running pytest's own)."""

    def __init__(self, sandbox: Path, pytest_parser, markers: set[str]):
        self.root, self.pytest_parser, self.markers = sandbox, pytest_parser, markers
        self.exported: dict[str, str] = {}

    def run_block(self, text: str) -> list[tuple[str, str | NotHere]]:
        """Every command of `text`, in order, with how it ran (a string) or `NotHere`; raises CommandFailed."""
        return [(line, outcome) for line in logical_lines(text) for outcome in self.run_line(line)]

    def run_line(self, line: str) -> list[str | NotHere]:
        with contextlib.chdir(self.root):
            filled = re.sub(r"\$\(([^()]*)\)", lambda m: shlex.quote(self.substitute(m[1])), fill_placeholders(line))
            return [self.run_command(command, line) for command in split_on(shlex.split(filled, comments=True), "&&")]

    def substitute(self, command: str) -> str:
        """The output of `$(command)`, run by bash (a secret generator, in these docs)."""
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                              env=os.environ | self.exported)
        if done.returncode != 0:
            raise CommandFailed(f"$({command}) failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def run_command(self, words: list[str], line: str) -> str | NotHere:
        env = {}
        while words and re.fullmatch(r"\w+=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = self.expand(value)
        argv = [self.expand(word) for word in words]
        if argv[:1] == ["export"]:
            for assignment in argv[1:]:
                name, _, value = assignment.partition("=")
                self.exported[name] = value
            return "exported"
        try:
            return self.run_program(argv, self.exported | env)
        except CommandFailed as exc:
            raise CommandFailed(f"`{line}`: {exc}") from None

    def expand(self, word: str) -> str:
        def value(match: re.Match) -> str:
            name = match[1] or match[2]
            if name not in self.exported and name not in os.environ:
                raise CommandFailed(f"${name} is not set")
            return self.exported.get(name, os.environ.get(name, ""))
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, word)

    def run_program(self, argv: list[str], env: dict[str, str]) -> str | NotHere:
        extras: list[str] = []
        if argv[:2] == ["uv", "run"]:
            argv = argv[2:]
            while argv and argv[0] == "--extra":
                extras.append(argv[1])
                argv = argv[2:]
        check_extras(extras)
        if not argv:
            raise CommandFailed("`uv run` names no program (a quoted fragment of a command is not a command)")
        program = Path(argv[0]).name
        argv = [program, *argv[1:]]
        if program == "torchrun":
            argv = ["python", *argv[argv.index("-m"):]]
            program = "python"
        if program in ("python", "python3"):
            return self.run_python(argv[1:], env)
        if program in MAINS:
            return self.dry_run(program, argv[1:], env)
        if program == "pytest":
            return self.check_pytest(argv[1:])
        if program == "prime-rl":
            from prime_rl.viewer import view

            return run_until_parsed(Path(view.__file__), argv[1:], lambda: view.main(argv[1:]))
        if program == "bash":
            return check_bash_script(self.root / argv[1])
        for name, why in NOT_HERE.items():
            if argv[:len(name.split())] == name.split():
                check_requirements(argv)
                return NotHere(why)
        raise CommandFailed(f"no way to run `{argv[0]}` in a test: teach tests/support/doc_commands.py or add it to "
                            "NOT_HERE (and fence the block ```bash partial)")

    def run_python(self, args: list[str], env: dict[str, str]) -> str:
        if args[0] == "-m" and args[1] in MODULES:
            return self.dry_run(MODULES[args[1]], args[2:], env)
        if args[0] == "-m" and args[1] == "pytest":
            return self.check_pytest(args[2:])
        if args[0] == "-m":
            spec = importlib.util.find_spec(args[1])
            if spec is None or spec.origin is None:
                raise CommandFailed(f"no module {args[1]}")
            return run_until_parsed(Path(spec.origin), args[2:], lambda: runpy.run_module(args[1], run_name="__main__"))
        script = self.root / args[0]
        if not script.is_file():
            raise CommandFailed(f"no script {args[0]}")
        with python_path([str(script.parent)]):  # as `python script.py` has it
            return run_until_parsed(script, args[1:], lambda: runpy.run_path(str(script), run_name="__main__"))

    def dry_run(self, command: str, args: list[str], env: dict[str, str]) -> str:
        """`command args --dry-run` in this process: the config loads, nothing starts."""
        args = list(args)
        for i, arg in enumerate(args[:-1]):
            if arg in ("--output-dir", "--output_dir"):
                args[i + 1] = self.in_sandbox(args[i + 1])
        paths = [str(self.root / part) for part in env.pop("PYTHONPATH", "").split(os.pathsep) if part]
        with python_path(paths):
            done = run_entrypoint(command, *args, "--dry-run", env=env)
        if done.returncode != 0:
            raise CommandFailed(f"`{command} --dry-run` exits {done.returncode}: {done.stderr.strip()[-2000:]}")
        return f"{command} --help" if {"-h", "--help"} & set(args) else f"{command} --dry-run"

    def in_sandbox(self, path: str) -> str:
        """An absolute output directory (a cluster's /shared/...) moved into the sandbox."""
        return str(self.root / path.lstrip("/")) if path.startswith("/") else path

    def check_pytest(self, args: list[str]) -> str:
        options, unknown = self.pytest_parser.parse_known_and_unknown_args(args)
        if unknown:
            raise CommandFailed(f"pytest has no option {unknown}")
        missing = [path for path in options.file_or_dir if not (self.root / path.split("::")[0]).exists()]
        if missing:
            raise CommandFailed(f"no test file {missing}")
        unregistered = set(re.findall(r"[\w-]+", options.markexpr)) - {"and", "or", "not"} - self.markers
        if unregistered:
            raise CommandFailed(f"no pytest marker {sorted(unregistered)} (registered: {sorted(self.markers)})")
        return "pytest arguments parsed"


def logical_lines(text: str) -> list[str]:
    """The lines of a shell block, continuation lines joined, blank and comment lines dropped."""
    lines = text.replace("\\\n", " ").splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def split_on(words: list[str], separator: str) -> list[list[str]]:
    """`a b && c` -> [[a, b], [c]]."""
    groups: list[list[str]] = [[]]
    for word in words:
        if word == separator:
            groups.append([])
        else:
            groups[-1].append(word)
    return [group for group in groups if group]


def fill_placeholders(line: str) -> str:
    """`line` with the placeholders of PLACEHOLDERS filled in; any other `<name>` is an error."""
    filled = re.sub(r"<[a-z][a-z ]*>|\bDIR\b", lambda m: shlex.quote(PLACEHOLDERS.get(m[0], m[0])), line)
    unknown = re.findall(r"<[a-z][a-z ]*>", filled)
    if unknown:
        raise CommandFailed(f"`{line}`: placeholder {unknown[0]} has no value in PLACEHOLDERS")
    return filled


@contextlib.contextmanager
def python_path(paths: list[str]):
    """PYTHONPATH for a command run in this process: `paths` first on sys.path while it runs, and sys.path as it
    was afterwards (also what the command itself put there)."""
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        yield
    finally:
        sys.path[:] = saved


class ArgumentsParsed(Exception):
    """Raised where a script's argparse parser has parsed its arguments: the script stops there."""


def run_until_parsed(source: Path, args: list[str], run: Callable[[], object]) -> str:
    """Run a Python program with `args` until its argparse parser accepted them; without a parser, compile it."""
    code = source.read_text()
    if "ArgumentParser(" not in code:
        compile(code, str(source), "exec")
        return "compiled (no argument parser to stop at)"
    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, *a, **kw):
        parse(parser, *a, **kw)  # a bad argument: usage and SystemExit(2)
        raise ArgumentsParsed

    err = io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(python_path([]))
        stack.enter_context(contextlib.redirect_stderr(err))
        stack.enter_context(contextlib.redirect_stdout(err))
        saved_argv, sys.argv = sys.argv, [str(source), *args]
        stack.callback(setattr, sys, "argv", saved_argv)
        argparse.ArgumentParser.parse_args = parse_then_stop
        stack.callback(setattr, argparse.ArgumentParser, "parse_args", parse)
        try:
            run()
        except ArgumentsParsed:
            return "arguments parsed"
        except SystemExit as exc:
            if exc.code:
                raise CommandFailed(f"{source.name} exits {exc.code}: {err.getvalue().strip()[-1000:]}") from None
            return "exited 0"
    raise CommandFailed(f"{source.name} ran to its end without parsing its arguments")


def check_bash_script(script: Path) -> str:
    if not script.is_file():
        raise CommandFailed(f"no script {script.name}")
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise CommandFailed(f"bash -n {script.name}: {done.stderr.strip()}")
    return "bash -n"


def check_extras(extras: list[str]) -> None:
    unknown = set(extras) - EXTRAS
    if unknown:
        raise CommandFailed(f"no extra {sorted(unknown)} in pyproject.toml (extras: {sorted(EXTRAS)})")


def check_requirements(argv: list[str]) -> None:
    """The extras an install names exist (`--extra X`, `prime-rl[X]`); a version it pins is pyproject.toml's."""
    words = [word for word in argv[1:] if not word.startswith("-")]
    check_extras([argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--extra"])
    for word in words if Path(argv[0]).name == "pip" and "install" in argv else []:
        requirement = Requirement(word) if re.match(r"[A-Za-z0-9][\w.\[\],-]*([<>=!~].*)?$", word) else None
        if requirement is None:
            continue
        if requirement.name == "prime-rl":
            check_extras(sorted(requirement.extras))
        pinned = PINS.get(requirement.name)
        if pinned is not None and requirement.specifier and requirement.specifier != pinned.specifier:
            raise CommandFailed(f"installs {word}, pyproject.toml has {pinned}")

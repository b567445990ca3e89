"""Every code block and shell command of the docs runs in a test: README.md, docs/*.md and examples/*/README.md
(`PAGES`, which must list every such page).

Every fenced block says what it is (`BLOCK_KINDS`); a bare or unknown fence fails. A ```python block runs as written,
and an environment class it defines is also used: made with its defaults, an example drawn, its reference answer
scored (a tool environment's tools called), so a stub or an undefined name inside a method fails too. A ```toml block
is a valid layer of an `rl` config. A ```bash block's commands run as far as a test can run them
(tests/support/doc_commands.py: prime-rl's commands with `--dry-run`, pytest's arguments parsed, scripts up to their
argument parsing, bash scripts syntax-checked), and so do the commands quoted inline in the prose (`uv run ...`,
`bash ...`, `pip ...`). A block that is partial on purpose says so in its fence: ```python partial (a sketch: listed,
not run), ```toml partial (names the reader fills in: parsed only), ```bash partial (it has commands a test cannot
run: installs, the network, a cluster; the rest of it runs, and the extras and pins those commands name are
checked)."""

from __future__ import annotations

import asyncio
import inspect
import re
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from prime_rl.configs.cli import build_config
from prime_rl.envs import ENVIRONMENTS, Environment
from prime_rl.envs.environment import Rollout
from prime_rl.envs.tools import ToolEnvironment
from prime_rl.launch.rl_config import RLConfig
from prime_rl.run_dir import weights_dir
from prime_rl.trainer.sft.config import SFTConfig
from tests.support import REPO
from tests.support.doc_commands import PRODUCTS, CommandFailed, DocShell, NotHere, make_sandbox

PAGES = [
    "README.md", "docs/agents.md",
    "docs/architecture.md", "docs/async.md", "docs/benchmarks.md", "docs/bring-your-own-algorithm.md",
    "docs/configs.md", "docs/deployment.md", "docs/environments.md", "docs/inference.md", "docs/losses.md",
    "docs/metrics.md", "docs/models.md", "docs/orchestrator.md", "docs/quickstart.md", "docs/rollouts.md",
    "docs/trainer.md",
    "examples/agent/README.md",
    "examples/alphabet_sort/README.md", "examples/code/README.md", "examples/dataset/README.md",
    "examples/is_reshape_study/README.md",
    "examples/multi_turn/README.md", "examples/reasoning_gym/README.md", "examples/reverse_text/README.md",
    "examples/rollout_correction_study/README.md", "examples/smollm2/README.md",
    "examples/tool_use/README.md",
]
BLOCK_KINDS = {
    "python": "runs as written", "python partial": "a sketch: listed, not run",
    "toml": "a valid layer of an rl config", "toml partial": "names the reader fills in: parsed only",
    "bash": "every command runs (doc_commands)", "bash partial": "has commands a test cannot run: the rest runs",
    "jsonc": "the shape of an HTTP body, elided with ...: not run", "text": "a diagram, a tree, math: not run",
}
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.DOTALL | re.MULTILINE)
INLINE_COMMAND = re.compile(r"`((?:uv|bash|pip) [^`\n]+)`")


@dataclass(frozen=True)
class Block:
    page: str
    number: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}#{self.number}"


def blocks(page: str, text: str | None = None) -> list[Block]:
    """Every fenced block of `page` (or of `text`, read as that page), numbered from 1, its body dedented."""
    text = (REPO / page).read_text() if text is None else text
    return [Block(page, i + 1, m["info"].strip(), textwrap.dedent(m["body"]))
            for i, m in enumerate(FENCE.finditer(text))]


def inline_commands(page: str) -> list[str]:
    """The commands quoted in the prose of `page` (outside its blocks)."""
    return INLINE_COMMAND.findall(FENCE.sub("", (REPO / page).read_text()))


def of_kind(*kinds: str) -> list:
    return [pytest.param(block, id=str(block)) for page in PAGES for block in blocks(page) if block.kind in kinds]


def run_snippet(code: str, where) -> dict:
    """Execute `code` as its own module in `where`; then use every Environment class it defined."""
    namespace = {"__name__": "docs_snippet"}
    before = dict(ENVIRONMENTS)
    try:
        exec(compile(code, "<docs snippet>", "exec"), namespace)  # noqa: S102  (the project's own docs)
        for cls in [v for v in namespace.values() if isinstance(v, type) and issubclass(v, Environment)
                    and v.__module__ == "docs_snippet"]:
            use_environment(cls())
    finally:
        ENVIRONMENTS.clear()
        ENVIRONMENTS.update(before)  # a block that registers its class leaves no trace
    return namespace


def use_environment(env: Environment) -> None:
    example = next(env.examples(seed=0))
    assert example.prompt and isinstance(example.answer, str)
    rollout = Rollout([{"role": "assistant", "content": example.answer}])
    reward = asyncio.run(env.score_rollout(example, rollout))
    assert reward.total == reward.total  # a number, not NaN
    if env.multi_turn:
        asyncio.run(env.respond(example, [{"role": "assistant", "content": "1"}], env.initial_state(example)))
    if isinstance(env, ToolEnvironment):
        for tool in env.tool_functions():
            tool(**{name: "x" for name in inspect.signature(tool).parameters})


@pytest.mark.parametrize("block", of_kind("python"))
def test_every_python_block_of_the_docs_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "examples" / "custom_loss"))  # bring-your-own-algorithm's my_loss.py
    monkeypatch.setitem(sys.modules, "docs_snippet", type(sys)("docs_snippet"))
    run_snippet(block.text, tmp_path)


@pytest.mark.slow  # the reasoning-gym block imports reasoning-gym (~3 s)
@pytest.mark.parametrize("block", of_kind("toml", "toml partial"))
def test_every_toml_block_of_the_docs_is_a_layer_of_an_rl_config(block, monkeypatch):
    layer = tomllib.loads(block.text)
    if block.kind == "toml":
        monkeypatch.syspath_prepend(str(REPO / "examples" / "custom_loss"))  # bring-your-own-algorithm's my_loss.py
        RLConfig.validate_layer(layer)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    return make_sandbox(tmp_path_factory.mktemp("repo"))


@pytest.fixture
def shell(sandbox, pytestconfig) -> DocShell:
    markers = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    return DocShell(sandbox, pytestconfig._parser, markers)  # the running pytest's own option parser


def run_shell_block(shell: DocShell, block: Block) -> list:
    """Every command of `block`; a ```bash block must run whole, a ```bash partial one must have what cannot."""
    outcomes = shell.run_block(block.text)
    not_here = [f"{line} ({outcome.why})" for line, outcome in outcomes if isinstance(outcome, NotHere)]
    if block.kind == "bash" and not_here:
        raise CommandFailed(f"{block}: a test cannot run {not_here}: fence the block ```bash partial")
    if block.kind == "bash partial" and not not_here:
        raise CommandFailed(f"{block}: every command runs in a test: fence the block ```bash")
    return outcomes


@pytest.mark.slow  # imports every component's entrypoint: ~6 s, most of it the first import
@pytest.mark.parametrize("block", of_kind("bash", "bash partial"))
def test_every_shell_block_of_the_docs_runs(block, shell):
    run_shell_block(shell, block)


@pytest.mark.slow  # as the blocks
@pytest.mark.parametrize("command", [pytest.param(command, id=f"{page}:{command}")
                                     for page in PAGES for command in inline_commands(page)])
def test_every_command_quoted_in_the_prose_runs(command, shell):
    shell.run_line(command)


@pytest.mark.parametrize("path, command", PRODUCTS.items())
def test_a_model_the_sandbox_stands_in_for_is_where_its_command_writes_it(path, command):
    """The commands after `command` on a page read `path`: it must be the last weights `command` writes."""
    name, at, toml = command.split()
    config, _ = build_config({"rl": RLConfig, "sft": SFTConfig}[name], [at, str(REPO / toml)])
    assert weights_dir(config.output_dir, config.max_steps) == Path(path)


def test_the_pages_covered_are_every_page_of_the_docs():
    found = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").glob("*/README.md")]
    assert sorted(page.relative_to(REPO).as_posix() for page in found) == PAGES


def test_a_broken_python_block_fails(tmp_path):
    broken = "from prime_rl.envs.environment import Example, Reward, SyntheticEnvironment\n" \
             "class Stub(SyntheticEnvironment):\n    id = 'stub'\n    def make_example(self, rng): ...\n" \
             "    async def score(self, example, completion):\n        return Reward(1.0)\n"
    with pytest.raises(AttributeError):  # the stub's example is None
        run_snippet(broken, tmp_path)
    with pytest.raises(NameError):
        run_snippet("def f():\n    return UNDEFINED\nf()\n", tmp_path)


BROKEN_SHELL_BLOCKS = {
    "an unknown flag": ("bash", "uv run rl @ examples/reverse_text/rl.toml --max-stepz 2",
                        "unknown config key 'max_stepz'"),
    "a missing example": ("bash", "uv run rl @ examples/reverse_text/rl_nope.toml", "config file not found: examples/"),
    "an unregistered marker": ("bash", "uv run pytest -m 'not slwo'", r"no pytest marker \['slwo'\]"),
    "a script's unknown flag": ("bash", "uv run python benchmarks/loss.py --repeatz 5", "unrecognized arguments"),
    "a missing script": ("bash", "bash scripts/build_tiny_modle.sh", "no script build_tiny_modle.sh"),
    "an unknown placeholder": ("bash", "uv run inference --model.name <model path>", "placeholder <model path>"),
    "an install in a whole block": ("bash", "pip install uv", "fence the block ```bash partial"),
    "a partial block that runs whole": ("bash partial", "uv run rl --help", "every command runs in a test"),
    "an unknown extra": ("bash partial", "uv sync --extra vllm-gpu", r"no extra \['vllm-gpu'\]"),
    "a pin that is not pyproject's": ("bash partial", "pip install torch==2.12.0", "pyproject.toml has torch==2.13.0"),
}


@pytest.mark.parametrize("kind, command, message", BROKEN_SHELL_BLOCKS.values(), ids=BROKEN_SHELL_BLOCKS)
def test_a_broken_shell_block_fails(kind, command, message, shell):
    (block,) = blocks("broken.md", f"```{kind}\n{command}\n```\n")
    with pytest.raises(CommandFailed, match=message):
        run_shell_block(shell, block)


def unclassified(blocks: list[Block]) -> list[str]:
    return [f"{block} (```{block.kind})" for block in blocks if block.kind not in BLOCK_KINDS]


def test_every_block_of_the_docs_says_what_it_is():
    unknown = unclassified([block for page in PAGES for block in blocks(page)])
    assert not unknown, f"fence each block as one of {sorted(BLOCK_KINDS)}: {unknown}"


def test_a_bare_fence_says_nothing_and_fails():
    assert unclassified(blocks("broken.md", "```\nls outputs\n```\n")) == ["broken.md#1 (```)"]

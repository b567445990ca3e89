"""Every Python block of the docs runs as written: README.md, docs/*.md and examples/*/README.md. A block fenced
```python partial is a sketch (a signature, names a reader fills in) and is listed, not run. An environment class a
block defines is also used: made with its defaults, an example drawn, its reference answer scored (a tool
environment's tools called), so a stub or an undefined name inside a method fails too."""

from __future__ import annotations

import asyncio
import inspect
import re
import sys

import pytest

from prime_rl.envs import ENVIRONMENTS, Environment
from prime_rl.envs.base import Rollout
from prime_rl.envs.tools import ToolEnvironment
from tests.support import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").glob("*/README.md")])
FENCE = re.compile(r"^```python( partial)?\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(page) -> list[tuple[str, bool]]:
    """(code, partial) of every ```python block of `page`."""
    return [(m.group(2), bool(m.group(1))) for m in FENCE.finditer(page.read_text())]


RUNNABLE = [pytest.param(code, id=f"{page.relative_to(REPO)}#{i + 1}")
            for page in PAGES for i, (code, partial) in enumerate(blocks(page)) if not partial]


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


@pytest.mark.parametrize("code", RUNNABLE)
def test_every_python_block_of_the_docs_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "examples" / "custom_loss"))  # bring-your-own-algorithm's my_loss.py
    monkeypatch.setitem(sys.modules, "docs_snippet", type(sys)("docs_snippet"))
    run_snippet(code, tmp_path)


def test_the_pages_with_code_are_covered_and_a_broken_block_fails(tmp_path):
    covered = {page.relative_to(REPO).as_posix() for page in PAGES if blocks(page)}
    assert {"docs/environments.md", "docs/orchestrator.md", "docs/bring-your-own-algorithm.md"} <= covered
    broken = "from prime_rl.envs.base import Example, Reward, SyntheticEnvironment\n" \
             "class Stub(SyntheticEnvironment):\n    id = 'stub'\n    def make_example(self, rng): ...\n" \
             "    async def score(self, example, completion):\n        return Reward(1.0)\n"
    with pytest.raises(AttributeError):  # the stub's example is None
        run_snippet(broken, tmp_path)
    with pytest.raises(NameError):
        run_snippet("def f():\n    return UNDEFINED\nf()\n", tmp_path)

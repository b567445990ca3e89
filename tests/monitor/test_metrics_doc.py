"""docs/metrics.md documents every metric name the code logs, and only those.

Metric names are found as string literals of the known prefixes in `src/prime_rl`; in an
f-string every `{...}` becomes `*`, and in the doc every `<placeholder>` does, so
f"reward/{env}/mean" in the code matches `reward/<env>/mean` in the doc.
"""

import ast
import re

import pytest
import torch

from prime_rl.orchestrator.metrics import advantage_metrics, reward_metrics
from tests.support import REPO

ROOT = REPO
SRC = ROOT / "src" / "prime_rl"
DOC = ROOT / "docs" / "metrics.md"
PREFIXES = ("loss", "optim", "perf", "reward", "advantage", "seq_len", "rollout", "async", "eval", "value",
            "curriculum")
METRIC = re.compile(rf"(?:{'|'.join(PREFIXES)})/[\w@.*/-]+")


def literal_text(node: ast.AST) -> str | None:
    """The value of a string literal; of an f-string with each `{...}` replaced by `*`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "*" for part in node.values)
    return None


def code_metrics() -> set[str]:
    names = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        # The literal pieces of an f-string ("reward/", "/mean") are not names of their own.
        pieces = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        for node in ast.walk(tree):
            text = None if id(node) in pieces else literal_text(node)
            if text is not None and METRIC.fullmatch(text):
                names.add(text)
    # The orchestrator's `_stats` joins a prefix and a statistic, so these are not literals.
    names |= set(reward_metrics([])) | set(advantage_metrics(torch.zeros(0), torch.zeros(0, dtype=torch.bool)))
    return names


def doc_metrics() -> set[str]:
    """The metric names in the first column of the doc's tables."""
    names = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("|"):
            first_cell = line.split("|")[1]
            names |= {re.sub(r"<[^>]+>", "*", name) for name in re.findall(r"`([^`]+)`", first_cell)}
    return {name for name in names if METRIC.fullmatch(name)}


def test_scanner_finds_literals_fstrings_and_generated_names():
    assert {"loss/importance_ratio", "reward/*/mean", "eval/*/pass@k", "loss/*", "reward/std"} <= code_metrics()


@pytest.mark.slow
def test_every_logged_metric_is_documented():
    missing = code_metrics() - doc_metrics()
    assert not missing, f"metrics logged but not in a table of docs/metrics.md: {sorted(missing)}"


def test_docs_list_only_logged_metrics():
    unknown = doc_metrics() - code_metrics()
    assert not unknown, f"docs/metrics.md lists metrics the code does not log: {sorted(unknown)}"

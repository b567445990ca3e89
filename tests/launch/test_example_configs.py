"""Every example resolves to the values recorded under tests/fixtures/resolved_examples/: what `--dry-run` prints,
and for `rl` the component configs the launcher writes to `configs/` (`plan_run`), ports and this machine's
paths blanked. A change to how configs are derived (handed down, filled in, planned) that moves a value shows up
here as a diff; a deliberate change re-records them with `RECORD_EXAMPLES=1 uv run pytest <this file>` and
the diff goes in the commit."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from prime_rl.configs.cli import build_config
from prime_rl.launch.plan import plan_run
from prime_rl.launch.rl_config import RLConfig
from prime_rl.trainer.sft.config import SFTConfig
from tests.support import REPO

RECORDED = REPO / "tests" / "fixtures" / "resolved_examples"
EXAMPLES = sorted(path for path in (REPO / "examples").glob("*/*.toml")
                  if path.name.startswith(("rl", "sft")))


def arguments(example: Path, output_dir: Path) -> list[str]:
    """`@ example` in a fresh output directory, a model the README builds first (`outputs/...`) replaced by the
    embedded one."""
    config = tomllib.loads(example.read_text())
    args = ["@", str(example), "--output-dir", str(output_dir)]
    for section, key in ((config, "--model.name"), (config.get("teacher", {}), "--teacher.model.name")):
        if section.get("model", {}).get("name", "").startswith("outputs/"):
            args += [key, "tiny-reverse-text"]
    return args


def blanked(value, output_dir: Path):
    """The JSON `value` with what differs between machines and runs replaced: ports, the output directory."""
    if isinstance(value, dict):
        return {key: 0 if key == "port" and isinstance(item, int) else blanked(item, output_dir)
                for key, item in value.items()}
    if isinstance(value, list):
        return [blanked(item, output_dir) for item in value]
    if isinstance(value, str):
        value = value.replace(str(output_dir.absolute()), "<output_dir>").replace(str(output_dir), "<output_dir>")
        return re.sub(r"(https?://[^/:]+):\d+", r"\1:<port>", value)
    return value


def resolved(example: Path, output_dir: Path) -> dict:
    """What the example resolves to: the config as `--dry-run` prints it and, for rl, each component's config
    as the launcher writes it."""
    cls = RLConfig if example.name.startswith("rl") else SFTConfig
    config, _ = build_config(cls, arguments(example, output_dir))
    result = {"dry_run": config.model_dump(mode="json")}
    if cls is RLConfig:
        plan = plan_run(config)
        result["configs"] = {name: component.model_dump(mode="json") for name, component in plan.components.items()}
        result["rl.toml"] = plan.recorded
    return blanked(result, output_dir)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_example_resolves_to_the_recorded_values(example, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # examples name their data sets relative to the checkout
    got = resolved(example, tmp_path / "run")
    record = RECORDED / f"{example.parent.name}__{example.stem}.json"
    if os.environ.get("RECORD_EXAMPLES"):
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert record.exists(), f"no record of {example}: run with RECORD_EXAMPLES=1"
    assert got == json.loads(record.read_text())


def test_every_record_belongs_to_an_example():
    names = {f"{path.parent.name}__{path.stem}.json" for path in EXAMPLES}
    assert {path.name for path in RECORDED.glob("*.json")} == names

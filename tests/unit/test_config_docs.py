"""docs/configs.md is generated from the config models and must stay in sync."""

from prime_rl.launch.config_docs import DOC_PATH, render


def test_configs_md_is_up_to_date():
    assert DOC_PATH.read_text() == render(), "docs/configs.md is stale: run `uv run python -m prime_rl.launch.config_docs`"

"""docs/configs.md is generated from the config models and must stay in sync."""

from prime_rl.launch.config_docs import DOC_PATH, render


def test_configs_md_is_up_to_date():
    assert DOC_PATH.read_text() == render(), (
        "docs/configs.md is stale: run `uv run python -m prime_rl.launch.config_docs`"
    )


def test_defaults_shown_are_those_of_the_parent_section_default():
    # SFTConfig's optim defaults to OptimConfig(lr=1e-3), not OptimConfig's own lr; its data to env reverse-text.
    from prime_rl.configs.describe import describe_config
    from prime_rl.trainer.sft.config import SFTConfig

    shown = {row.key: row.default for row in describe_config(SFTConfig)}
    assert shown["optim.lr"] == repr(SFTConfig().optim.lr) == "0.001"
    assert shown["data.env"] == "'reverse-text'"

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


def test_keys_every_loss_type_takes_alike_are_listed_once_and_the_others_per_type():
    """The 8 `[loss.correction]` keys (and the regularizers') were repeated under each of the 14 types."""
    from prime_rl.configs.describe import describe_config
    from prime_rl.configs.loss import LOSSES
    from prime_rl.launch.rl_config import RLConfig

    rows = describe_config(RLConfig)
    keys = [row.key for row in rows]
    for key in ("loss.correction", "loss.correction.reject", "loss.correction.weight_cap", "loss.kl_coef"):
        assert keys.count(key) == 1, key
        assert next(row.condition for row in rows if row.key == key) == ""
    # a key whose default differs by type stays under each type: normalization is 'sequence' for sapo only
    normalization = {row.condition: row.default for row in rows if row.key == "loss.normalization"}
    assert normalization["loss.type=sapo"] == "'sequence'" and normalization["loss.type=default"] == "'token'"
    assert len(normalization) == len(LOSSES.names)  # every type has one

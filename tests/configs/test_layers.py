"""Rules on which layer set a key: `sft`'s model.name against [init], and `none` turning an optional section off.

Guards against a model named on the command line (or in a PRIME_* variable, or a later file) silently losing to
an example file's [init], which trains a random char-level model instead of the one asked for."""

from __future__ import annotations

import tomllib

import pytest

from prime_rl.configs.cli import parse_config
from prime_rl.launch.rl_config import RLConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.sft.config import SFTConfig
from tests.support import REPO

SFT_TOML = REPO / "examples" / "reverse_text" / "sft.toml"
RL_TOML = REPO / "examples" / "reverse_text" / "rl.toml"
INIT = '[init]\ntokenizer = "char"\noverrides = { hidden_size = 32 }\n'


def build(capsys, config_cls, *argv):
    """The config `config_cls` parses from argv (no --dry-run) and what it printed to stderr."""
    config = parse_config(config_cls, [str(a) for a in argv])
    return config, capsys.readouterr().err


def one_line_exit_2(capsys, config_cls, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(config_cls, [str(a) for a in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_the_example_alone_builds_a_random_model_without_a_notice(capsys):
    config, err = build(capsys, SFTConfig, "@", SFT_TOML)
    assert config.init is not None and config.init.overrides["hidden_size"] == 128
    assert err == ""


def test_a_model_on_the_command_line_drops_the_files_init_with_one_notice(capsys, tmp_path):
    config, err = build(capsys, SFTConfig, "@", SFT_TOML, "--model.name", tmp_path)
    assert config.init is None and config.model.name == str(tmp_path)
    assert err == f"note: --model.name {tmp_path} given: ignoring [init] from {SFT_TOML}\n"


def test_other_model_keys_leave_init_alone(capsys):
    """Only model.name says where the model starts; trust_remote_code applies to [init]'s build too."""
    config, err = build(capsys, SFTConfig, "@", SFT_TOML, "--model.trust-remote-code")
    assert config.init is not None and config.model.trust_remote_code
    assert err == ""


def test_a_model_in_a_prime_variable_drops_the_files_init(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PRIME_MODEL__NAME", str(tmp_path))
    config, err = build(capsys, SFTConfig, "@", SFT_TOML)
    assert config.init is None and config.model.name == str(tmp_path)
    assert err == f"note: PRIME_MODEL__NAME={tmp_path} given: ignoring [init] from {SFT_TOML}\n"


def test_init_on_the_command_line_beats_a_model_in_a_prime_variable(capsys, monkeypatch):
    monkeypatch.setenv("PRIME_MODEL__NAME", "some/model")
    config, err = build(capsys, SFTConfig, "--init.tokenizer", "char")
    assert config.init is not None and config.init.tokenizer == "char"
    assert err == ("note: [init] from the command line builds a random model: "
                   "ignoring PRIME_MODEL__NAME=some/model\n")


def test_between_files_the_later_one_decides(capsys, tmp_path):
    init, named = tmp_path / "init.toml", tmp_path / "named.toml"
    init.write_text(INIT)
    named.write_text('[model]\nname = "some/model"\n')
    config, err = build(capsys, SFTConfig, "@", init, "@", named)
    assert config.init is None and config.model.name == "some/model"
    assert err == f"note: model.name = 'some/model' in {named} given: ignoring [init] from {init}\n"
    config, err = build(capsys, SFTConfig, "@", named, "@", init)
    assert config.init is not None and config.init.overrides == {"hidden_size": 32}
    assert err == f"note: [init] from {init} builds a random model: ignoring model.name = 'some/model' in {named}\n"


def test_a_file_that_includes_the_example_and_names_a_model_starts_from_that_model(capsys, tmp_path):
    """An included file is a layer below the file that includes it (it is read first)."""
    variant = tmp_path / "variant.toml"
    variant.write_text(f'include = "{SFT_TOML}"\nmax_steps = 5\n[model]\nname = "some/model"\n')
    config, err = build(capsys, SFTConfig, "@", variant)
    assert (config.init, config.model.name, config.max_steps) == (None, "some/model", 5)
    assert err == f"note: model.name = 'some/model' in {variant} given: ignoring [init] from {SFT_TOML}\n"


@pytest.mark.parametrize("how", ["flag", "env", "file"])
def test_none_turns_init_off(capsys, monkeypatch, tmp_path, how):
    argv = ["@", SFT_TOML]
    if how == "flag":
        argv += ["--init", "none"]
    elif how == "env":
        monkeypatch.setenv("PRIME_INIT", "none")
    else:
        (tmp_path / "off.toml").write_text('init = "none"\n')
        argv += ["@", tmp_path / "off.toml"]
    config, err = build(capsys, SFTConfig, *argv)
    assert config.init is None and config.model.name == "tiny-reverse-text"
    assert err == ""


def test_init_none_beside_a_model_in_one_layer_is_no_conflict(capsys):
    config, err = build(capsys, SFTConfig, "@", SFT_TOML, "--init", "none", "--model.name", "some/model")
    assert (config.init, config.model.name, err) == (None, "some/model", "")


@pytest.mark.parametrize("flag", ["--no-init", "--init"])
def test_init_is_no_on_off_flag_and_the_error_says_how_to_turn_it_off(capsys, flag):
    err = one_line_exit_2(capsys, SFTConfig, "@", SFT_TOML, flag)
    assert "option --init is a section, not an on/off flag: --init none turns it off" in err


def test_model_path_is_no_key_and_the_error_names_model_name(capsys, tmp_path):
    """`model.path` is the resolved directory (a property), not a key: the flag is an error, never ignored."""
    err = one_line_exit_2(capsys, SFTConfig, "@", SFT_TOML, "--model.path", tmp_path)
    assert "unknown config key 'model.path' (allowed here: name, trust_remote_code)" in err


CONFLICT = "model.name and [init] both come from {}: keep one"


def test_model_and_init_in_one_file_is_an_error_even_when_a_flag_decides(capsys, tmp_path):
    both = tmp_path / "both.toml"
    both.write_text(f'[model]\nname = "some/model"\n{INIT}')
    for extra in ([], ["--model.name", "other/model"], ["--init", "none"]):
        err = one_line_exit_2(capsys, SFTConfig, "@", both, *extra)
        assert CONFLICT.format(both) in err


def test_model_and_init_on_the_command_line_is_an_error(capsys):
    err = one_line_exit_2(capsys, SFTConfig, "@", SFT_TOML, "--model.name", "some/model", "--init.tokenizer", "char")
    assert CONFLICT.format("the command line") in err


def test_model_and_init_in_prime_variables_is_an_error(capsys, monkeypatch):
    monkeypatch.setenv("PRIME_MODEL__NAME", "some/model")
    monkeypatch.setenv("PRIME_INIT__TOKENIZER", "char")
    err = one_line_exit_2(capsys, SFTConfig)
    assert CONFLICT.format("the PRIME_* variables") in err


@pytest.mark.parametrize("extra", [[], ["--model.name", "some/model"]], ids=["init", "model"])
def test_sft_dry_run_loads_back(capsys, tmp_path, extra):
    """--dry-run (and configs/sft.toml, the same dump) leaves the unused model.name out beside [init]: one
    file with both would be the conflict above."""
    with pytest.raises(SystemExit) as exit_info:
        parse_config(SFTConfig, ["@", str(SFT_TOML), *extra, "--dry-run"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    assert ("init" in tomllib.loads(printed)) == (not extra)
    assert ("name" in tomllib.loads(printed)["model"]) == bool(extra)
    resolved = tmp_path / "resolved.toml"
    resolved.write_text(printed)
    assert build(capsys, SFTConfig, "@", resolved)[0] == build(capsys, SFTConfig, "@", SFT_TOML, *extra)[0]


def test_rl_hands_a_command_line_model_to_the_trainer(capsys, monkeypatch):
    config, err = build(capsys, RLConfig, "@", RL_TOML, "--model.name", "tiny-calculator")
    assert config.trainer.model.name == config.orchestrator.model.name == "tiny-calculator"
    assert err == ""
    monkeypatch.setenv("PRIME_MODEL__NAME", "tiny-multi-turn")
    config, _ = build(capsys, RLConfig, "@", RL_TOML)
    assert config.trainer.model.name == "tiny-multi-turn"


@pytest.mark.parametrize(("config_cls", "key"), [(RLConfig, "init"), (RLConfig, "trainer.init"),
                                                 (TrainerConfig, "init")])
def test_only_sft_has_init(capsys, config_cls, key):
    """The RL trainer always loads model.name: [init] there is an unknown key, not a silent no-op."""
    err = one_line_exit_2(capsys, config_cls, f"--{key}", "none")
    assert f"unknown config key '{key}'" in err


def test_none_turns_off_any_optional_section_or_value_and_a_text_key_keeps_it(capsys):
    config, _ = build(capsys, RLConfig, "@", REPO / "examples" / "reverse_text" / "rl_lora.toml")
    assert config.trainer.lora is not None
    config, _ = build(capsys, RLConfig, "@", REPO / "examples" / "reverse_text" / "rl_lora.toml",
                      "--trainer.lora", "none", "--wandb.name", "none")
    assert config.trainer.lora is None
    assert config.wandb.name == "none"  # a text key keeps the text
    config, _ = build(capsys, RLConfig, "--ckpt.interval", "none", "--trainer.optim.max-norm", "none",
                      "--trainer.keep-weights", "none", "--loss.correction.weight", "none")
    assert config.ckpt.interval is None and config.trainer.optim.max_norm is None
    assert config.trainer.keep_weights is None and config.loss.correction.weight == "none"  # a choice keeps the word


def test_a_none_whose_default_is_something_else_reaches_the_components_and_loads_back(tmp_path, capsys):
    """Regression: TOML has no null and a None was left out of the files `rl` hands its components, which then took
    the default: `--trainer.optim.max-norm none` clipped at 1.0, `--ckpt.interval none` checkpointed every 50."""
    import tomllib

    from prime_rl.configs.base import config_data
    from prime_rl.configs.toml_io import dump_toml
    from prime_rl.launch.plan import plan_run
    from prime_rl.trainer.config import TrainerConfig

    config, _ = build(capsys, RLConfig, "--output-dir", str(tmp_path / "run"), "--ckpt.interval", "none",
                      "--trainer.optim.max-norm", "none")
    trainer = plan_run(config).components["trainer"]
    text = dump_toml(config_data(trainer))
    (tmp_path / "trainer.toml").write_text(text)
    again, _ = build(capsys, TrainerConfig, "@", tmp_path / "trainer.toml")
    assert again.ckpt.interval is None and again.optim.max_norm is None
    assert tomllib.loads(text)["ckpt"]["interval"] == "none" and tomllib.loads(text)["optim"]["max_norm"] == "none"

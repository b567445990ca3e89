"""PRIME_* environment variables that set nothing: an error when meant as a key, else a one-line warning."""

from __future__ import annotations

import re

import pytest

from prime_rl.configs.cli import build_config, parse_config
from prime_rl.configs.env_vars import INTERNAL_ENV_VARS, unknown_env_vars
from prime_rl.inference.config import InferenceConfig
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.utils.errors import ConfigError
from tests.support import SRC

ENTRYPOINTS = [RLConfig, TrainerConfig, OrchestratorConfig, InferenceConfig, SFTConfig]



@pytest.mark.parametrize(
    ("name", "suggestion"),
    [
        ("PRIME_MAX_STEPZ", "PRIME_MAX_STEPS"),
        ("PRIME_SEQLEN", "PRIME_SEQ_LEN"),
        ("PRIME_TRAINER_OPTIM_LR", "PRIME_TRAINER__OPTIM__LR"),  # single underscores: not nested
        ("PRIME_TRAINER__OPTIM__LRR", "PRIME_TRAINER__OPTIM__LR"),
        ("prime_max_stepz", "PRIME_MAX_STEPS"),  # pydantic-settings matches names case-insensitively
    ],
)
def test_near_miss_of_a_key_is_an_error_naming_the_key(monkeypatch, capsys, name, suggestion):
    monkeypatch.setenv(name, "3")
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, [])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"environment variable {name} is not a config key of rl" in err
    assert f"did you mean {suggestion}?" in err


@pytest.mark.parametrize("name", ["PRIME_DEPLOYMENT__FOO", "PRIME_TRAINER__NOPE__X", "PRIME_LOSS__WHATEVER"])
def test_unknown_key_inside_a_section_is_an_error(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    with pytest.raises(ConfigError, match=rf"{name} is not a config key of rl \(no key"):
        build_config(RLConfig, [])


def test_unrelated_prime_variable_is_a_one_line_warning(monkeypatch, capsys):
    monkeypatch.setenv("PRIME_FOO", "1")
    config = build_config(RLConfig, ["--max-steps", "4"])[0]
    assert config.max_steps == 4
    assert capsys.readouterr().err == "warning: ignoring environment variable PRIME_FOO: not a config key of rl\n"


def test_a_key_of_another_command_only_warns(monkeypatch, capsys):
    # Exported for `rl`, then `trainer` run by hand: not a typo of a trainer key.
    monkeypatch.setenv("PRIME_TRAINER__OPTIM__LR", "1e-5")
    assert build_config(TrainerConfig, [])[0].optim.lr == 3e-4
    assert "ignoring environment variable PRIME_TRAINER__OPTIM__LR" in capsys.readouterr().err


@pytest.mark.parametrize("config_cls", ENTRYPOINTS)
def test_internal_variables_are_silent(monkeypatch, capsys, config_cls):
    for name in INTERNAL_ENV_VARS:
        monkeypatch.setenv(name, "7")
    build_config(config_cls, [])
    assert capsys.readouterr().err == ""


def test_known_keys_are_used_without_a_word(monkeypatch, capsys):
    monkeypatch.setenv("PRIME_MAX_STEPS", "9")
    monkeypatch.setenv("PRIME_TRAINER__MAX_STEPS", "9")  # a component's shared key: allowed when it agrees
    monkeypatch.setenv("PRIME_LOSS__TYPE", "sapo")
    monkeypatch.setenv("PRIME_LOSS__TAU_POS", "0.5")  # a key of one union variant
    config = build_config(RLConfig, [])[0]
    assert (config.max_steps, config.loss.type) == (9, "sapo")
    assert capsys.readouterr().err == ""


def test_anything_below_a_dict_key_is_known():
    environ = {"PRIME_ORCHESTRATOR__ENV__0__ID": "x", "PRIME_ORCHESTRATOR__ADVANTAGE__KWARGS__SCALE": "2"}
    assert unknown_env_vars(RLConfig, environ) == []
    assert unknown_env_vars(SFTConfig, {"PRIME_INIT__OVERRIDES__HIDDEN_SIZE": "8"}) == []


def test_a_section_given_a_non_json_value_is_one_line(monkeypatch):
    monkeypatch.setenv("PRIME_DEPLOYMENT", "x")
    with pytest.raises(ConfigError, match=r"invalid PRIME_\* environment variable: .*deployment"):
        build_config(RLConfig, [])


def _prime_names_in_src() -> set[str]:
    pattern = re.compile(r"""["'](PRIME_[A-Z0-9_]+)["']""")
    return {m for path in SRC.rglob("*.py") for m in pattern.findall(path.read_text())}


def _known_to(config_cls, name: str) -> bool:
    try:
        return unknown_env_vars(config_cls, {name: "1"}) == []
    except ConfigError:
        return False


def test_every_prime_variable_the_code_names_is_a_config_key_or_internal():
    # A variable prime-rl sets or reads itself must not trip the unknown-variable rule: either a
    # config key of some command (PRIME_API_KEY) or listed in INTERNAL_ENV_VARS.
    names = _prime_names_in_src()
    assert "PRIME_INFERENCE_CONTEXT_LEN" in names  # the scan finds them
    strays = [n for n in sorted(names - INTERNAL_ENV_VARS) if not any(_known_to(c, n) for c in ENTRYPOINTS)]
    assert strays == [], "neither a config key of any command nor in INTERNAL_ENV_VARS"

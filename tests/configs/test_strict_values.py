"""Values pydantic's lax mode would quietly convert: booleans for numbers, bare flags, inf/nan, AdamW ranges."""

from __future__ import annotations

import functools
import math
import re

import pytest

from prime_rl.configs.cli import build_config, parse_args, parse_config
from prime_rl.configs.describe import describe_config
from prime_rl.inference.config import InferenceConfig
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.utils.errors import ConfigError

ENTRYPOINTS = [RLConfig, TrainerConfig, OrchestratorConfig, InferenceConfig, SFTConfig]
INT_KEY = {RLConfig: "max-steps", TrainerConfig: "max-steps", OrchestratorConfig: "batch-size",
           InferenceConfig: "port", SFTConfig: "max-steps"}


def build(config_cls, *argv):
    return build_config(config_cls, list(argv))[0]


@pytest.mark.parametrize("config_cls", ENTRYPOINTS)
@pytest.mark.parametrize("value", ["true", "false"])
def test_a_boolean_for_an_int_key_is_an_error_not_one_step(config_cls, value):
    key = INT_KEY[config_cls]
    with pytest.raises(ConfigError, match=rf"invalid value for '{key.replace('-', '_')}': true/false is only valid"):
        build(config_cls, f"--{key}", value)


@pytest.mark.parametrize("config_cls", ENTRYPOINTS)
@pytest.mark.parametrize("after", [[], ["--seed", "3"], ["--dry-run"], ["@", "x.toml"]])
def test_an_int_flag_without_a_value_is_an_error(config_cls, after):
    # At the end of the line, or followed by another option / file: today both parse as `true` = 1.
    key = INT_KEY[config_cls]
    with pytest.raises(ConfigError, match=rf"option --{key} needs a value"):
        build(config_cls, f"--{key}", *after)


def test_negated_non_boolean_flag_is_an_error():
    with pytest.raises(ConfigError, match="option --max-steps needs a value"):
        build(RLConfig, "--no-max-steps")


def test_bare_flags_are_recorded_with_their_target_key():
    args = parse_args(["--trainer.runtime.compile", "--no-overwrite", "--max-steps", "3", "--x=1"])
    assert args.bare_flags == ("trainer.runtime.compile", "overwrite")


def test_boolean_keys_still_take_flags_and_literals():
    assert build(RLConfig, "--overwrite").overwrite is True
    assert build(RLConfig, "--trainer.runtime.compile", "false").trainer.runtime.compile is False
    assert build(RLConfig, "--trainer.runtime.no-compile").trainer.runtime.compile is False
    assert build(SFTConfig, "--runtime.deterministic").runtime.deterministic is True


def test_unknown_bare_flag_is_reported_as_unknown_key():
    with pytest.raises(ConfigError, match="unknown config key 'nope'"):
        build(RLConfig, "--nope")


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("max_steps = true\n", "max_steps"),
        ("[trainer.optim]\nlr = true\n", "trainer.optim.lr"),
        ("[trainer.optim]\nbetas = [true, 0.5]\n", "trainer.optim.betas"),
        ("[deployment]\ninference_gpu_ids = [0, true]\n", "deployment.inference_gpu_ids"),
        ('[loss]\ntype = "sapo"\ntau_pos = true\n', "loss.tau_pos"),
        ("[ckpt]\nresume_step = true\n", "ckpt.resume_step"),
    ],
)
def test_booleans_in_toml_only_for_on_off_keys(tmp_path, content, key):
    path = tmp_path / "c.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=rf"invalid value for '{key}': true/false is only valid"):
        build(RLConfig, "@", str(path))


def test_boolean_env_var_for_an_int_key_is_an_error(monkeypatch):
    monkeypatch.setenv("PRIME_MAX_STEPS", "true")
    with pytest.raises(ConfigError, match="invalid value for 'max_steps'"):
        build(RLConfig)


def _float_keys():
    for config_cls in ENTRYPOINTS:
        for row in describe_config(config_cls):
            if "float" in row.type.split("|"):
                yield config_cls, row.key, row.condition


@pytest.mark.parametrize(("config_cls", "key", "condition"), list(_float_keys()),
                         ids=lambda v: getattr(v, "command", v))
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_every_float_key_rejects_non_finite_values(config_cls, key, condition, value):
    # Not one field at a time: the base classes forbid inf/nan for every float field, but for the one that says
    # inf means "unbounded" (the correction's weight cap: no truncation).
    select = [f"--{condition.partition('=')[0]}", condition.partition("=")[2]] if condition else []
    if value == "inf" and key.endswith("correction.weight_cap"):
        if condition.endswith("=custom"):
            return  # a custom type needs an import path; the same key is checked under every other type
        prefix = key.removesuffix("weight_cap")
        config = build(config_cls, *select, f"--{prefix}old-logprobs", "trainer", f"--{prefix}weight", "token",
                       f"--{key}", value)
        assert math.isinf(functools.reduce(getattr, key.split("."), config))
        return
    with pytest.raises(ConfigError, match=rf"invalid value for '{key}'"):
        build(config_cls, *select, f"--{key}", value)


def test_lr_inf_in_toml_and_env_is_an_error(tmp_path, monkeypatch, capsys):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nlr = inf\n")
    with pytest.raises(SystemExit) as exit_info:
        parse_config(TrainerConfig, ["@", str(path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {path}: invalid value for 'optim.lr': Input should be a finite number (got inf)\n"
    )
    monkeypatch.setenv("PRIME_OPTIM__LR", "inf")
    with pytest.raises(ConfigError, match="optim.lr': Input should be a finite number"):
        build(TrainerConfig)


@pytest.mark.parametrize("betas", ["[0.0, 0.0]", "[0.9, 0.999]", "[0.99999, 0.5]"])
def test_adamw_betas_in_zero_one_are_fine(betas):
    assert build(TrainerConfig, "--optim.betas", betas).optim.betas[0] < 1


@pytest.mark.parametrize(("betas", "where", "why"), [
    ("[1.0, 0.999]", "betas[0]", "less than 1"),
    ("[0.9, 1.0]", "betas[1]", "less than 1"),
    ("[-0.1, 0.999]", "betas[0]", "greater than or equal to 0"),
    ("[0.9, 1.5]", "betas[1]", "less than 1"),
])
def test_adamw_betas_outside_zero_one_are_errors(betas, where, why):
    with pytest.raises(ConfigError, match=rf"'optim\.{re.escape(where)}': Input should be {why}"):
        build(TrainerConfig, "--optim.betas", betas)
    with pytest.raises(ConfigError, match=rf"'trainer\.optim\.{re.escape(where)}'"):
        build(RLConfig, "--trainer.optim.betas", betas)


@pytest.mark.parametrize("eps", ["0", "-1e-8"])
def test_adamw_eps_must_be_positive(eps):
    with pytest.raises(ConfigError, match="'optim.eps': Input should be greater than 0"):
        build(SFTConfig, "--optim.eps", eps)

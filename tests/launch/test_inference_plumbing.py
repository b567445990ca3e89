"""How `rl` hands the inference server its API key and weight directory (never through disk)."""

from __future__ import annotations

import pytest

from prime_rl.configs.toml_io import dump_toml
from prime_rl.inference.config import InferenceConfig
from prime_rl.launch.plan import API_KEY_ENV, run_api_key
from prime_rl.launch.rl import child_env
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.utils.errors import ConfigError


def test_the_env_variables_rl_sets_are_the_ones_the_children_read(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV["inference"], "k-inf")
    monkeypatch.setenv(API_KEY_ENV["orchestrator"], "k-orch")
    assert InferenceConfig.build().api_key.get_secret_value() == "k-inf"
    assert OrchestratorConfig.build().client.api_key.get_secret_value() == "k-orch"


def test_without_a_key_each_run_gets_a_random_one_for_both_children():
    config = RLConfig.build()
    first, second = run_api_key(config), run_api_key(config)
    key = first["inference"]["PRIME_API_KEY"]
    assert first["orchestrator"] == {"PRIME_CLIENT__API_KEY": key} and len(key) >= 32
    assert second["inference"]["PRIME_API_KEY"] != key
    assert "trainer" not in first


def test_a_configured_key_is_handed_to_both_and_contradictions_are_errors():
    config = RLConfig.build(overrides={"inference": {"api_key": "mine"}})
    assert run_api_key(config) == {"inference": {"PRIME_API_KEY": "mine"},
                                   "orchestrator": {"PRIME_CLIENT__API_KEY": "mine"}}
    config = RLConfig.build(overrides={"orchestrator": {"client": {"api_key": "theirs"}}})
    assert run_api_key(config)["inference"] == {"PRIME_API_KEY": "theirs"}
    config = RLConfig.build(overrides={"inference": {"api_key": "a"}, "orchestrator": {"client": {"api_key": "b"}}})
    with pytest.raises(ConfigError, match="differ"):
        run_api_key(config)


def test_keys_never_reach_a_config_dump(monkeypatch):
    config = RLConfig.build(overrides={"inference": {"api_key": "top-secret"},
                                       "orchestrator": {"client": {"api_key": "top-secret"}}})
    for dumped in (config.model_dump(mode="json"), config.inference.model_dump(mode="json"),
                   config.orchestrator.model_dump(mode="json")):
        assert "top-secret" not in dump_toml(dumped) and "api_key" not in dump_toml(dumped)
    assert "top-secret" not in repr(config) and "top-secret" not in str(config)


def test_child_env_drops_the_parents_prime_variables_and_adds_the_key(monkeypatch):
    monkeypatch.setenv("PRIME_MAX_STEPS", "3")
    env = child_env("", {"PRIME_API_KEY": "k"})
    assert env["PRIME_API_KEY"] == "k" and "PRIME_MAX_STEPS" not in env
    assert "PRIME_API_KEY" not in child_env("")

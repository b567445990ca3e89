"""OrchestratorConfig: defaults, TOML shape, and one-line validation errors."""

from __future__ import annotations

import importlib.util
import itertools
import pickle

import pytest

from prime_rl.configs.cli import build_config, parse_config
from prime_rl.envs.reverse_text import ReverseTextEnv
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.utils.errors import ConfigError


def build(*argv: str) -> OrchestratorConfig:
    return build_config(OrchestratorConfig, list(argv))[0]


def test_defaults():
    config = build()
    assert config.client.base_url == "http://127.0.0.1:8000/v1" and config.trainer_world_size == 1
    assert [e.id for e in config.env] == ["reverse-text"] and config.advantage.type == "grpo"
    assert config.advantage.std_normalize and config.max_async_level == 1


def test_toml_with_several_envs_and_an_advantage(tmp_path):
    path = tmp_path / "orch.toml"
    path.write_text(
        """
batch_size = 16
rollouts_per_example = 4
[[env]]
id = "reverse-text"
args = {min_len = 3, max_len = 6}
weight = 2.0
[[env]]
id = "arithmetic"
[advantage]
type = "rloo"
[sampling]
temperature = 0.7
max_tokens = 20
[eval]
interval = 5
rollouts = 4
"""
    )
    config = build("@", str(path), "--client.base-url", "http://127.0.0.1:9000/v1")
    assert [(e.id, e.weight) for e in config.env] == [("reverse-text", 2.0), ("arithmetic", 1.0)]
    assert config.env[0].args == {"min_len": 3, "max_len": 6}
    assert config.advantage.type == "rloo" and config.sampling.max_tokens == 20 and config.eval.rollouts == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch-size", "10"], "batch_size (10) must be divisible by rollouts_per_example (8)"),
        (["--rollouts-per-example", "1", "--batch-size", "4"], "rollouts_per_example must be >= 2"),
        (["--advantage.type", "ppo"], "advantage"),
        (["--advantage.type", "grpo", "--advantage.nope", "1"], "unknown config key 'advantage.nope'"),
        (["--advantage.type", "custom", "--advantage.import-path", "no_such_mod.fn"], "cannot import module"),
        (["--env", '[{id = "nope"}]'], "unknown environment 'nope'"),
        (["--env", '[{id = "reverse-text", args = {min_len = 0}}]'], "min_len <= max_len"),
        (["--env", '[{id = "reverse-text"}, {id = "reverse-text"}]'], "environment names must be unique"),
        (["--env", '[{id = "reverse-text", weight = 0}]'], "env[0].weight"),
        (["--trainer-world-size", "0"], "trainer_world_size"),
        (["--sampling.top-p", "0"], "sampling.top_p"),
        (["--sampling.top-k", "0"], "top_k = 0 keeps no token"),
        (["--sampling.top-k", "-2"], "sampling.top_k"),
        (["--sampling.min-p", "1.5"], "sampling.min_p"),
        (["--sampling.min-p", "nan"], "sampling.min_p"),
    ],
)
def test_bad_values_are_one_line_config_errors(argv, message):
    if "nope" in argv[-1] and importlib.util.find_spec("verifiers") is not None:
        pytest.skip("with verifiers installed unknown ids are checked at run time")
    with pytest.raises(ConfigError) as err:
        build(*argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_one_rollout_per_example_is_fine_for_a_custom_advantage():
    config = build("--rollouts-per-example", "1", "--batch-size", "4", "--advantage.type", "custom",
                   "--advantage.import-path", "prime_rl.advantages.group:whiten_samples")
    assert config.advantage.type == "custom"


@pytest.mark.parametrize("value", ["0", "0.0", "-0.5", "1e-4", "inf", "nan"])
@pytest.mark.parametrize("config_cls", [OrchestratorConfig, RLConfig])
def test_training_temperature_must_be_positive_and_finite(capsys, config_cls, value):
    # The trainer computes log_softmax(logits / T): T = 0 gives NaN at step 0.
    key = "orchestrator.sampling.temperature" if config_cls is RLConfig else "sampling.temperature"
    with pytest.raises(SystemExit) as exit_info:
        parse_config(config_cls, [f"--{key}", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"invalid value for '{key}': training needs a finite temperature >= 0.001" in err
    assert "greedy decoding (0) is for eval.temperature only" in err


def test_truncation_reaches_the_sampling_rule():
    rule = build("--sampling.top-k", "20", "--sampling.top-p", "0.9", "--sampling.min-p", "0.05").sampling.rule
    assert (rule.top_k, rule.top_p, rule.min_p, rule.truncates) == (20, 0.9, 0.05, True)
    assert not build().sampling.rule.truncates


def test_greedy_is_for_eval_only():
    assert build("--sampling.temperature", "0.001").sampling.temperature == 0.001
    config = build("--eval.temperature", "0", "--eval.interval", "1")
    assert config.eval.temperature == 0.0 and config.sampling.temperature == 1.0
    with pytest.raises(ConfigError, match=r"eval.temperature': Input should be a finite number"):
        build("--eval.temperature", "inf")


def test_an_environment_named_by_import_path_is_named_by_its_id_in_metrics():
    from prime_rl.orchestrator.config import EnvConfig

    assert EnvConfig(id="prime_rl.envs.reverse_text:ReverseTextEnv").metric_name == "reverse-text"
    assert EnvConfig(id="tests.support.multi_turn_envs:ToolChat").metric_name == "tool-chat"
    assert EnvConfig(id="tests.support.multi_turn_envs:ToolChat", name="mine").metric_name == "mine"
    with pytest.raises(ValueError, match="names must be unique, repeated: reverse-text"):
        OrchestratorConfig.build([], {"env": [{"id": "reverse-text"},
                                              {"id": "prime_rl.envs.reverse_text:ReverseTextEnv"}]})


@pytest.mark.parametrize("key", ["chat_template", "self", "conversations"])
def test_chat_template_kwargs_that_are_renderer_arguments_are_refused_at_load(key):
    with pytest.raises(ValueError, match=f"may not set {key}"):
        OrchestratorConfig.build([], {"chat_template_kwargs": {key: "x"}})


class CountedEnv(ReverseTextEnv):
    """reverse-text over a pool of 3 examples (a curriculum can weigh them) that counts how often it is built."""

    id = "counted"
    built = 0

    def __init__(self, **args):
        CountedEnv.built += 1
        super().__init__(**args)
        self.pool = list(itertools.islice(super().examples(seed=0), 3))

    def example_pool(self):
        return self.pool


def test_an_environment_is_built_once_for_the_checks_the_draws_and_the_evaluation(tmp_path, monkeypatch):
    from prime_rl.orchestrator.examples.draws import ExampleSource
    from prime_rl.orchestrator.orchestrator import eval_draws

    monkeypatch.setattr(CountedEnv, "built", 0)
    config = OrchestratorConfig.build(overrides={
        "output_dir": str(tmp_path), "env": [{"id": f"{__name__}:CountedEnv", "args": {"max_len": 6}}],
        "eval": {"interval": 1, "num_examples": 2}, "curriculum": {}})
    source = ExampleSource(config.env, config.seed)
    draws = eval_draws(config, source.envs)
    assert CountedEnv.built == 1 and draws[0].environment is source.envs["counted"] is config.env[0].build()
    copy = config.model_copy(deep=True)
    assert copy == config and copy.env[0].build() is not source.envs["counted"]  # a deep copy builds its own
    assert CountedEnv.built == 2
    other = config.env[0].model_copy(update={"args": {"max_len": 9}})  # a shallow copy with other args
    assert other.build().max_len == 9 and pickle.loads(pickle.dumps(config.env[0])).build().max_len == 6
    config.env[0].args = {"max_len": 7}  # assigned (validated again): built again from what it now says
    assert config.env[0].build().max_len == 7
    with pytest.raises(ValueError, match="need 1 <= min_len <= max_len"):  # checked again, not the kept one's
        config.env[0].args = {"min_len": 5, "max_len": 2}

"""Config precedence, CLI parsing, --help, --dry-run and one-line errors."""

from __future__ import annotations

import tomllib

import pytest

from prime_rl.configs.cli import build_config, parse_args, parse_config, render_help
from prime_rl.launch.rl_config import RLConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.utils.errors import ConfigError


@pytest.fixture
def two_tomls(tmp_path):
    a = tmp_path / "a.toml"
    a.write_text('max_steps = 5\nseq_len = 256\n[trainer.optim]\nlr = 1e-3\nweight_decay = 0.5\n')
    b = tmp_path / "b.toml"
    b.write_text("[trainer.optim]\nlr = 2e-3\n")
    return a, b


def build(argv):
    return build_config(RLConfig, argv)[0]


def test_defaults_apply_without_files():
    config = build([])
    assert config.max_steps == RLConfig.model_fields["max_steps"].default
    assert config.trainer.optim.lr == 3e-4


def test_later_toml_wins_and_tables_merge(two_tomls):
    a, b = two_tomls
    config = build(["@", str(a), "@", str(b)])
    assert config.trainer.optim.lr == 2e-3  # b overrides a
    assert config.trainer.optim.weight_decay == 0.5  # a's other keys survive
    assert config.max_steps == 5


def test_include_reads_the_base_file_first(tmp_path):
    (tmp_path / "base.toml").write_text('max_steps = 5\n[trainer.optim]\nlr = 1e-3\nweight_decay = 0.5\n')
    variant = tmp_path / "variant.toml"
    variant.write_text('include = "base.toml"\n[trainer.optim]\nlr = 2e-3\n[loss]\ntype = "sapo"\n')
    config = build(["@", str(variant)])
    assert (config.max_steps, config.trainer.optim.lr, config.trainer.optim.weight_decay) == (5, 2e-3, 0.5)
    assert config.loss.type == "sapo"


def test_include_cycle_and_missing_include_are_clean_errors(tmp_path, capsys):
    (tmp_path / "a.toml").write_text('include = ["b.toml"]\n')
    (tmp_path / "b.toml").write_text('include = "a.toml"\n')
    (tmp_path / "c.toml").write_text('include = "nope.toml"\n')
    for name, expected in [("a.toml", "includes itself"), ("c.toml", "config file not found")]:
        with pytest.raises(SystemExit) as exit_info:
            parse_config(RLConfig, ["@", str(tmp_path / name)])
        assert exit_info.value.code == 2
        assert expected in capsys.readouterr().err


def test_attached_at_form(two_tomls):
    a, _ = two_tomls
    assert build([f"@{a}"]).max_steps == 5


def test_env_beats_toml(two_tomls, monkeypatch):
    a, b = two_tomls
    monkeypatch.setenv("PRIME_TRAINER__OPTIM__LR", "5e-4")
    monkeypatch.setenv("PRIME_MAX_STEPS", "9")
    config = build(["@", str(a), "@", str(b)])
    assert config.trainer.optim.lr == 5e-4
    assert config.max_steps == 9
    assert config.trainer.optim.weight_decay == 0.5


def test_cli_beats_env(two_tomls, monkeypatch):
    a, b = two_tomls
    monkeypatch.setenv("PRIME_MAX_STEPS", "9")
    monkeypatch.setenv("PRIME_TRAINER__OPTIM__LR", "5e-4")
    config = build(["@", str(a), "@", str(b), "--max-steps", "7", "--trainer.optim.lr=1e-5"])
    assert config.max_steps == 7
    assert config.trainer.optim.lr == 1e-5


def test_shared_keys_reach_every_component(two_tomls):
    a, _ = two_tomls
    config = build(["@", str(a), "--model.name", "tiny-calculator", "--seed", "3"])
    for sub in (config.trainer, config.orchestrator):
        assert sub.max_steps == 5 and sub.seq_len == 256 and sub.seed == 3
        assert sub.model.name == "tiny-calculator"
    assert config.inference.model.name == "tiny-calculator"
    assert config.inference.seq_len == 256


def test_contradicting_shared_key_is_an_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("max_steps = 5\n[trainer]\nmax_steps = 6\n")
    with pytest.raises(ConfigError, match=r"trainer\.max_steps.*contradicts"):
        build(["@", str(bad)])


def test_agreeing_shared_key_is_fine(tmp_path):
    ok = tmp_path / "ok.toml"
    ok.write_text("max_steps = 5\n[trainer]\nmax_steps = 5\n")
    assert build(["@", str(ok)]).trainer.max_steps == 5


def test_boolean_flags():
    assert build(["--trainer.runtime.compile"]).trainer.runtime.compile is True
    assert build(["--trainer.runtime.compile", "--trainer.runtime.no-compile"]).trainer.runtime.compile is False


@pytest.mark.parametrize("flag", ["--no-trainer.runtime.compile", "--no_trainer.runtime.compile",
                                  "--trainer.runtime.no-compile", "--trainer.runtime.no_compile"])
def test_a_boolean_in_a_section_turns_off_with_no_before_the_key_or_before_its_last_part(flag):
    assert build(["--trainer.runtime.compile", flag]).trainer.runtime.compile is False


def test_a_negated_flag_of_a_key_that_is_not_on_off_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, ["--no-trainer.optim.lr"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "option --trainer.optim.lr needs a value" in err, err


def test_value_parsing():
    args = parse_args(["--a", "7", "--b", "1e-5", "--c", "sapo", "--d", "[1, 2]", "--e", "true", "--f", "-3"])
    assert args.overrides == {"a": 7, "b": 1e-5, "c": "sapo", "d": [1, 2], "e": True, "f": -3}


def test_dry_run_prints_resolved_toml(two_tomls, capsys):
    a, b = two_tomls
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, ["@", str(a), "@", str(b), "--max-steps", "7", "--dry-run"])
    assert exit_info.value.code == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["max_steps"] == 7
    assert printed["trainer"]["optim"]["lr"] == 2e-3
    assert printed["trainer"]["max_steps"] == 7


def test_dry_run_output_loads_back(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_config(RLConfig, ["--max-steps", "4", "--dry-run"])
    resolved = tmp_path / "resolved.toml"
    resolved.write_text(capsys.readouterr().out)
    assert build(["@", str(resolved)]) == build(["--max-steps", "4"])


def test_help_lists_nested_keys_with_descriptions():
    text = render_help(RLConfig)
    assert "--loss.type" in text
    lr_line = next(line for line in text.splitlines() if line.startswith("--trainer.optim.lr "))
    assert "learning rate" in lr_line and "default" in lr_line


def test_help_and_the_reference_give_a_multi_line_description_whole():
    """A docstring over several lines is one line of --help and of docs/configs.md, cut nowhere."""
    from prime_rl.launch.config_docs import render

    docstring = " ".join(RLConfig.model_fields["seq_len"].description.split())
    assert docstring.count(".") >= 1 and len(RLConfig.model_fields["seq_len"].description.splitlines()) > 1
    help_line = next(line for line in render_help(RLConfig).splitlines() if line.startswith("--seq_len "))
    assert docstring in help_line
    assert docstring in render()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("max_stepz = 3\n", "unknown config key 'max_stepz'"),
        ("[trainer.optim]\nlrr = 1.0\n", "unknown config key 'trainer.optim.lrr'"),
        ("max_steps = 'many'\n", "invalid value for 'max_steps'"),
        ('[trainer.scheduler]\ntype = "exponential"\n', "'constant', 'linear' or 'cosine'"),
        ("[trainer.optim]\nlr = -1.0\n", "invalid value for 'trainer.optim.lr': Input should be greater than 0"),
        ("max_steps = = 3\n", "is not valid TOML"),
        ('[loss]\ntype = "nope"\n', "'loss'"),
    ],
)
def test_bad_config_errors_name_the_problem(tmp_path, capsys, content, expected):
    bad = tmp_path / "bad.toml"
    bad.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, ["@", str(bad)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert expected in err


def test_missing_file_is_a_clean_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_config(TrainerConfig, ["@", str(tmp_path / "nope.toml")])
    assert exit_info.value.code == 2
    assert "config file not found" in capsys.readouterr().err


def test_unknown_cli_key_lists_allowed_keys(capsys):
    with pytest.raises(SystemExit):
        parse_config(RLConfig, ["--trainer.optim.lrr", "1"])
    err = capsys.readouterr().err
    assert "unknown config key 'trainer.optim.lrr'" in err and "lr" in err


@pytest.mark.parametrize("bad, hidden_by", [
    ('max_steps = "ten"\n', ["--max-steps", "3"]),  # the command line sets the key too
    ('[trainer.optim]\nlr = "fast"\n', ["@", "LATER"]),  # a later file sets it too
    ('[loss]\ntype = "sapo"\ntau_pos = "high"\n', ["--loss.tau-pos", "1.5"]),  # inside a union section
    ('[[orchestrator.env]]\nid = "reverse-text"\nweight = "heavy"\n', []),  # in a list of tables
])
def test_a_bad_value_in_a_file_is_refused_even_when_another_layer_overrides_it(tmp_path, capsys, bad, hidden_by):
    """Every file's values are validated on their own, not only the merged winner: one line naming the file."""
    (tmp_path / "bad.toml").write_text(bad)
    (tmp_path / "later.toml").write_text('max_steps = 4\n[trainer.optim]\nlr = 1e-3\n')
    argv = ["@", str(tmp_path / "bad.toml"), *[str(tmp_path / "later.toml") if a == "LATER" else a for a in hidden_by]]
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'bad.toml'}: invalid value for '"), err


@pytest.mark.parametrize("name, value, hidden_by", [
    ("PRIME_MAX_STEPS", "ten", ["--max-steps", "3"]),
    ("PRIME_TRAINER__OPTIM__LR", "fast", ["--trainer.optim.lr", "1e-5"]),
])
def test_a_bad_prime_variable_is_refused_even_when_the_command_line_overrides_it(monkeypatch, capsys, name, value,
                                                                                  hidden_by):
    """The PRIME_* variables are a layer of their own, validated as a file is: one line naming the variable."""
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(RLConfig, hidden_by)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: environment variable {name}: invalid value for '"), err
    monkeypatch.setenv(name, "7" if name == "PRIME_MAX_STEPS" else "1e-3")  # a good one the command line overrides
    config = parse_config(RLConfig, hidden_by)
    assert (config.max_steps, config.trainer.optim.lr) in ((3, config.trainer.optim.lr), (config.max_steps, 1e-5))


def test_a_file_that_is_only_valid_together_with_another_is_accepted(tmp_path):
    """Rules across keys are judged on the merged config: a file may set half of what a later one completes,
    and a file may leave a key to the default or to the command line."""
    (tmp_path / "a.toml").write_text('[orchestrator]\nrollout_mode = "continuous"\n')
    (tmp_path / "b.toml").write_text('[inference]\nbackend = "builtin"\n')
    config = build(["@", str(tmp_path / "a.toml"), "@", str(tmp_path / "b.toml"), "--max-steps", "2"])
    assert config.orchestrator.rollout_mode == "continuous" and config.max_steps == 2
    (tmp_path / "c.toml").write_text("seq_len = 128\n[orchestrator.sampling]\nmax_tokens = 64\n")
    assert build(["@", str(tmp_path / "c.toml")]).seq_len == 128

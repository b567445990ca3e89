"""Checks at load time (so --dry-run fails too): TOML encoding, hosts, output dirs, and contradictions
between keys and with the model's context."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prime_rl.configs.cli import build_config, parse_config
from prime_rl.configs.validators import check_host
from prime_rl.inference.config import InferenceConfig
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.sft.config import SFTConfig
from prime_rl.utils.errors import ConfigError


def build(config_cls, *argv):
    return build_config(config_cls, [str(a) for a in argv])[0]


def one_line_exit_2(capsys, config_cls, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(config_cls, [str(a) for a in argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


# ---------------------------------------------------------------------------- TOML files


@pytest.mark.parametrize("config_cls", [RLConfig, TrainerConfig, OrchestratorConfig, InferenceConfig, SFTConfig])
def test_non_utf8_toml_is_one_line_naming_the_file(tmp_path, capsys, config_cls):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes("seed = 1 # caf\u00e9\n".encode("latin-1"))
    err = one_line_exit_2(capsys, config_cls, "@", bad, "--dry-run")
    assert f"config file {bad} is not UTF-8 text (byte 0xe9 at offset 14)" in err


def test_unreadable_toml_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text("seed = 1\n")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(ConfigError, match=rf"cannot read config file {path}: Permission denied$"):
        build(RLConfig, "@", path)


def test_an_included_non_utf8_file_is_named(tmp_path):
    (tmp_path / "base.toml").write_bytes(b"seed = 1\n\xff\n")
    (tmp_path / "top.toml").write_text('include = "base.toml"\n')
    with pytest.raises(ConfigError, match=r"base\.toml is not UTF-8 text"):
        build(RLConfig, "@", tmp_path / "top.toml")


# ---------------------------------------------------------------------------- hosts


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "node-7.cluster.local",
                                  "gpu01", "example.com."])
def test_valid_hosts(host):
    assert check_host(host) == host
    assert build(InferenceConfig, "--host", host).host == host


@pytest.mark.parametrize(("host", "why"), [
    ("999.1.1.1", "not a valid IPv4 address"),
    ("256.0.0.1", "not a valid IPv4 address"),
    ("1.2.3", "not a valid IPv4 address"),
    ("", "neither an IP address nor a valid host name"),
    ("bad_host", "neither an IP address nor a valid host name"),
    ("-lead.example", "neither an IP address nor a valid host name"),
    ("a..b", "neither an IP address nor a valid host name"),
    ("x" * 64 + ".com", "neither an IP address nor a valid host name"),
    ("http://127.0.0.1", "neither an IP address nor a valid host name"),
])
def test_invalid_hosts_are_load_errors(capsys, host, why):
    err = one_line_exit_2(capsys, RLConfig, "--inference.host", host, "--dry-run")
    assert f"invalid value for 'inference.host': {host!r} is {why}" in err
    one_line_exit_2(capsys, InferenceConfig, f"--host={host}", "--dry-run")


# ---------------------------------------------------------------------------- output dirs


@pytest.mark.parametrize("config_cls", [RLConfig, TrainerConfig, OrchestratorConfig, SFTConfig])
def test_output_dir_that_is_a_file_is_a_load_error(tmp_path, capsys, config_cls):
    afile = tmp_path / "afile"
    afile.write_text("x")
    err = one_line_exit_2(capsys, config_cls, "--output-dir", afile, "--dry-run")
    assert f"output dir {afile} is a file, not a directory" in err
    err = one_line_exit_2(capsys, config_cls, "--output-dir", afile / "run", "--dry-run")
    assert f"cannot be created: {afile} is a file" in err
    assert afile.read_text() == "x"


@pytest.mark.parametrize("path", ["/proc/run", "/proc", "/sys/kernel/run"])
def test_output_dir_on_a_kernel_file_system_is_a_load_error(capsys, path):
    err = one_line_exit_2(capsys, RLConfig, "--output-dir", path, "--dry-run")
    assert "is on the kernel file system" in err


def test_output_dir_through_a_symlink_into_proc(tmp_path):
    (tmp_path / "link").symlink_to("/proc/self")
    with pytest.raises(ConfigError, match="kernel file system /proc"):
        build(TrainerConfig, "--output-dir", tmp_path / "link" / "run")


def test_unwritable_output_dir_is_a_load_error(tmp_path, monkeypatch):
    # (root passes access() checks, so the refusal is simulated; `rl` also probes with a real write)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real_access(p, mode))
    with pytest.raises(ConfigError, match=rf"cannot write {tmp_path}/a/b: no write permission on {tmp_path} "):
        build(RLConfig, "--output-dir", tmp_path / "a" / "b")


def test_output_dir_on_a_read_only_file_system_says_so(tmp_path, monkeypatch):
    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(os, "access", lambda p, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly)
    with pytest.raises(ConfigError, match=rf"cannot write {tmp_path}/run: read-only file system \({tmp_path}\)"):
        build(SFTConfig, "--output-dir", tmp_path / "run")


def test_new_output_dir_is_fine_and_not_created_at_load(tmp_path):
    config = build(RLConfig, "--output-dir", tmp_path / "new" / "run")
    assert config.output_dir == tmp_path / "new" / "run"
    assert not (tmp_path / "new").exists()


# ---------------------------------------------------------------------------- model context


def model_dir(tmp_path: Path, config: dict | str | None, name: str = "model") -> Path:
    path = tmp_path / name
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return path


@pytest.mark.parametrize("max_tokens", [512, 513, 4096])
def test_max_tokens_beyond_the_embedded_models_context(capsys, max_tokens):
    err = one_line_exit_2(capsys, RLConfig, "--orchestrator.sampling.max-tokens", max_tokens, "--dry-run")
    assert f"orchestrator.sampling.max_tokens = {max_tokens} leaves no room for a prompt in the model's context " \
           "of 512 tokens (max_position_embeddings in" in err


def test_max_tokens_just_inside_the_context_is_fine():
    assert build(RLConfig, "--orchestrator.sampling.max-tokens", 511).orchestrator.sampling.max_tokens == 511


@pytest.mark.parametrize("config", [{"max_position_embeddings": 64}, {"n_positions": 64},
                                    {"text_config": {"max_position_embeddings": 64}}])
def test_context_of_a_local_model_directory(tmp_path, config):
    path = model_dir(tmp_path, config)
    assert build(OrchestratorConfig, "--model.name", path, "--sampling.max-tokens", 63).sampling.max_tokens == 63
    with pytest.raises(ConfigError, match=r"invalid config: sampling\.max_tokens = 64 leaves no room .* context of 64"):
        build(OrchestratorConfig, "--model.name", path, "--sampling.max-tokens", 64)


def test_rl_checks_its_model_after_handing_it_down(tmp_path):
    # The orchestrator section is validated with its own default model first; the check must use rl's.
    small = model_dir(tmp_path, {"max_position_embeddings": 64}, "small")
    with pytest.raises(ConfigError, match=r"orchestrator\.sampling\.max_tokens = 100 .* context of 64"):
        build(RLConfig, "--model.name", small, "--orchestrator.sampling.max-tokens", 100)
    large = model_dir(tmp_path, {"max_position_embeddings": 4096}, "large")
    config = build(RLConfig, "--model.name", large, "--orchestrator.sampling.max-tokens", 1000)  # > the default's 512
    assert config.orchestrator.sampling.max_tokens == 1000


@pytest.mark.parametrize(("content", "why"), [
    (None, "config.json is missing"),
    ("{not json", "cannot read"),
    ("[1, 2]", "does not hold a JSON object"),
])
def test_unreadable_local_model_config_is_one_line(tmp_path, capsys, content, why):
    path = model_dir(tmp_path, content)
    err = one_line_exit_2(capsys, RLConfig, "--model.name", path, "--dry-run")
    assert f"model '{path}'" in err and why in err


def test_model_config_without_a_context_length_skips_the_check(tmp_path):
    path = model_dir(tmp_path, {"model_type": "custom"})
    assert build(RLConfig, "--model.name", path, "--orchestrator.sampling.max-tokens", 1000)


def test_a_hub_model_not_on_this_machine_is_one_line_at_load(capsys):
    """Nothing is downloaded: a hub name outside the Hugging Face cache stops rl at once, naming what is accepted;
    a SLURM script rendered for later (another machine's cache) is not checked."""
    name = "some-org/not-downloaded-model"
    err = one_line_exit_2(capsys, RLConfig, "--model.name", name, "--dry-run")
    assert f"model.name: model {name!r} is not on this machine and nothing is downloaded: name an embedded" in err
    assert "SmolLM2-135M-Instruct, a model directory, or a hub name already in the Hugging Face cache" in err
    assert build(RLConfig, "--model.name", name, "--slurm.partition", "gpu").model.name == name


def test_a_local_model_path_that_does_not_exist_yet_is_one_line_at_load(capsys):
    """The example rl.tomls name the output of their sft step: before it ran, rl stops at once (not after the
    servers' start-up), naming the model key; a SLURM script rendered for later is not checked."""
    err = one_line_exit_2(capsys, RLConfig, "--model.name", "./outputs/not-yet/weights/step_10", "--dry-run")
    assert "model.name: model './outputs/not-yet/weights/step_10': no such directory" in err
    assert build(RLConfig, "--model.name", "./outputs/not-yet/weights/step_10", "--slurm.partition", "gpu")


# ---------------------------------------------------------------------------- contradictions


def test_max_tokens_must_leave_room_for_a_prompt_in_seq_len(capsys):
    err = one_line_exit_2(capsys, RLConfig, "--seq-len", 128, "--orchestrator.sampling.max-tokens", 128, "--dry-run")
    assert "orchestrator.sampling.max_tokens = 128 leaves no room for a prompt in seq_len = 128" in err
    assert build(RLConfig, "--seq-len", 129, "--orchestrator.sampling.max-tokens", 128).seq_len == 129


def test_seq_len_set_in_a_toml_counts_after_hand_down(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text("seq_len = 64\n[orchestrator.sampling]\nmax_tokens = 100\n")
    with pytest.raises(ConfigError, match="leaves no room for a prompt in seq_len = 64"):
        build(RLConfig, "@", path)


def test_standalone_orchestrator_cuts_long_rollouts_instead():
    # On its own the orchestrator truncates rollouts to seq_len (its server may have a longer context).
    assert build(OrchestratorConfig, "--seq-len", 64, "--sampling.max-tokens", 128).seq_len == 64


@pytest.mark.parametrize(("backend", "fails"), [("vllm", True), ("auto", True), ("builtin", False)])
def test_max_tokens_against_vllm_max_model_len(backend, fails):
    argv = ["--inference.backend", backend, "--inference.vllm.max-model-len", 100,
            "--orchestrator.sampling.max-tokens", 100]
    if fails:
        with pytest.raises(ConfigError, match="leaves no room for a prompt in inference.vllm.max_model_len = 100"):
            build(RLConfig, *argv)
    else:
        assert build(RLConfig, *argv).inference.backend == "builtin"


def test_overwrite_and_resume_contradict(capsys):
    err = one_line_exit_2(capsys, RLConfig, "--overwrite", "--ckpt.resume-step", "latest", "--dry-run")
    assert "overwrite deletes the run that ckpt.resume_step continues" in err


@pytest.mark.parametrize("value", ["0", "0.0", "1e-4"])
def test_temperature_below_the_training_minimum_fails_dry_run(capsys, value):
    err = one_line_exit_2(capsys, RLConfig, "--orchestrator.sampling.temperature", value, "--dry-run")
    assert "training needs a finite temperature" in err


def test_checks_rerun_on_assignment():
    config = build(RLConfig)
    with pytest.raises(ValueError, match="leaves no room for a prompt"):
        config.orchestrator.sampling = {"max_tokens": 600}


@pytest.mark.parametrize("seed", [str(2**63), str(-(2**63) - 1), "99999999999999999999999"])
def test_a_seed_beyond_64_bits_is_a_load_error(seed):
    """Regression: it passed --dry-run and crashed the inference server's generator."""
    with pytest.raises(ConfigError, match="seed"):
        build_config(RLConfig, ["--seed", seed])


def test_rl_does_not_share_prompts_with_a_trainer_on_flash_attention():
    """flash_attention_2 computes a shared prompt once per completion: rows packed to seq_len by shared length
    would expand far past it in the trainer's forward."""
    assert build_config(RLConfig, [])[0].orchestrator.share_prompts
    flash = ["--trainer.runtime.attn-implementation", "flash_attention_2"]
    assert not build_config(RLConfig, flash)[0].orchestrator.share_prompts
    with pytest.raises(ConfigError, match="orchestrator.share_prompts = true contradicts trainer.runtime"):
        build_config(RLConfig, [*flash, "--orchestrator.share-prompts", "true"])


def test_rl_refuses_a_request_budget_below_one_rollout_request():
    """Every rollout request (rollouts_per_example x max_tokens completion tokens) would be a 400 at run time."""
    small = ["--inference.max-request-tokens", "1000", "--orchestrator.rollouts-per-example", "8"]
    assert build_config(RLConfig, [*small, "--orchestrator.sampling.max-tokens", "125"])[0]
    with pytest.raises(ConfigError, match=r"inference.max_request_tokens \(1000\) is below one rollout request's "
                                          r"rollouts_per_example x sampling.max_tokens \(1008\)"):
        build_config(RLConfig, [*small, "--orchestrator.sampling.max-tokens", "126"])

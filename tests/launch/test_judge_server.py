"""A `[judge]` makes rl serve a judge model beside the policy: its own server config, the run's key, and the URL,
model and key handed to the orchestrator, where a judge reward without base_url finds it; in a real (in-process)
run the judge's replies reach the reward."""

from __future__ import annotations

import json

import pytest

from prime_rl.configs.cli import build_config
from prime_rl.launch import plan, rl
from prime_rl.launch.rl_config import RLConfig
from prime_rl.utils.errors import ConfigError
from tests.support.rl_in_process import run_in_process

JUDGED = ('[{id = "dataset", args = {path = "%s", rewards = {judge = 1.0}, '
          'reward_options = {judge = {template = "Rate {completion} from 0 to 10.", max_tokens = 8}}}}]')


def rows(tmp_path) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": p[::-1]}) + "\n" for p in ("abcde", "fghij", "klmno")))
    return str(path)


def test_rl_serves_the_judge_and_hands_the_orchestrator_its_url_model_and_key(tmp_path):
    config = build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--judge.model.name", "tiny-reverse-text",
                                     "--judge.backend", "builtin", "--orchestrator.env", JUDGED % rows(tmp_path)])[0]
    assert "judge" in rl.component_commands(config)
    server = plan.judge_server(config, 1234)
    assert (server.model.name, server.backend, server.port, server.weight_dirs, server.num_servers) == (
        "tiny-reverse-text", "builtin", 1234, [], 1)
    keys = plan.run_api_key(config)
    assert keys["judge"]["PRIME_API_KEY"] == keys["orchestrator"]["PRIME_JUDGE_API_KEY"] == keys["inference"][
        "PRIME_API_KEY"]


def test_a_judge_reward_without_a_url_needs_the_judge_rl_serves(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="the judge reward has no base_url: give the judge's URL"):
        build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--orchestrator.env", JUDGED % rows(tmp_path)])
    monkeypatch.setenv("PRIME_INFERENCE__API_KEY", "shared")
    with pytest.raises(ConfigError, match="a split run does not start the judge's server"):
        build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--judge.model.name", "tiny-reverse-text",
                                "--deployment.components", '["orchestrator", "trainer"]',
                                "--orchestrator.client.base-url", "http://127.0.0.1:9/v1",
                                "--orchestrator.env", JUDGED % rows(tmp_path)])


@pytest.mark.slow
def test_in_a_run_the_judges_replies_reach_the_reward(tmp_path, capfd):
    """The embedded reverse-text model as the judge answers letters, never a number: every rollout fails with the
    judge's own reply quoted, which only a reply from the served judge (its URL, model name and key) can give."""
    run = run_in_process(["--output-dir", str(tmp_path / "run"), "--model.name", "tiny-reverse-text",
                          "--judge.model.name", "tiny-reverse-text", "--max-steps", "1", "--seq-len", "256",
                          "--orchestrator.batch-size", "8", "--orchestrator.rollouts-per-example", "4",
                          "--orchestrator.sampling.max-tokens", "8", "--wandb.mode", "disabled",
                          "--orchestrator.env", JUDGED % rows(tmp_path)])
    row = run.rows("orchestrator")[0]
    assert row["rollout/env_error_frac"] == 1.0
    logged = capfd.readouterr().err  # an in-process run logs to stderr
    assert "the judge's reply holds no number" in logged and "no judge server" not in logged

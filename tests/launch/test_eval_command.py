"""`eval`: a model scored on an rl config's held-out examples, equal to what the run's own evaluation logged at the
same weights; its bad inputs are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from prime_rl.configs.cli import parse_config
from prime_rl.launch.eval_command import EvalCommandConfig, evaluate, main
from tests.support.rl_in_process import on_policy_run
from tests.support.rl_runs import on_policy_args

ENV = '[[orchestrator.env]]\nid = "reverse-text"\n'
EVAL = ["--orchestrator.eval.interval", "1", "--orchestrator.eval.num-examples", "12"]


@pytest.mark.slow
@pytest.mark.parametrize("training", [[], ["--trainer.lora.rank", "4", "--trainer.optim.lr", "5e-3"]],
                         ids=["full", "lora"])
def test_eval_equals_the_runs_own_evaluation_at_the_same_weights(tmp_path, capsys, training):
    """The base model (no --step) and a published step (--step 2: full weights, or a LoRA adapter merged into the
    base as the run's server merges it) score what the run's `eval/<env>/...` logged at steps 0 and 2 (greedy, the
    same 12 held-out examples); the table names the columns, the JSON the figures."""
    run = on_policy_run(tmp_path, ENV, seq_len=128, max_tokens=12, extra=[*EVAL, *training])
    logged = run.rows("orchestrator")
    argv = [*on_policy_args(tmp_path, ENV, 128, 12), *EVAL, *training]
    for step in (None, 2):
        extra = [] if step is None else ["--step", str(step)]
        report = evaluate(parse_config(EvalCommandConfig, [*argv, *extra]))
        row = report["results"]["reverse-text"]
        expected = logged[step or 0]
        assert row["examples"] == 12
        assert row["accuracy"] == pytest.approx(expected["eval/reverse-text/pass@k"], abs=1e-6), step  # float32 there
        assert row["reward"] == pytest.approx(expected["eval/reverse-text/reward"], abs=1e-9), step
        assert 0 < row["tokens"] <= 12
        written = tmp_path / "run" / "eval" / ("base.json" if step is None else f"step_{step}.json")
        assert json.loads(written.read_text()) == report
    out = capsys.readouterr().out
    assert "env           examples  accuracy  reward" in out and "written: " in out


@pytest.mark.slow
def test_eval_samples_k_completions_for_pass_at_k(tmp_path, capsys):
    argv = [*on_policy_args(tmp_path, ENV, 128, 12), "--orchestrator.eval.num-examples", "6",
            "--orchestrator.eval.rollouts", "4", "--orchestrator.eval.temperature", "1.0",
            "--output", str(tmp_path / "scores.json")]
    report = evaluate(parse_config(EvalCommandConfig, argv))
    row = report["results"]["reverse-text"]
    assert {"accuracy", "reward", "tokens", "pass@4", "sampled_reward", "sampled_tokens"} <= set(row)
    assert row["pass@4"] >= 0 and 0 <= row["sampled_reward"] <= 1
    assert json.loads((tmp_path / "scores.json").read_text())["results"] == report["results"]


@pytest.mark.parametrize(("args", "says"), [
    (["--step", "7"], "--step 7: no weights at"),
    (["--inference.backend", "vllm"], "eval serves with the builtin engine"),
    (["--model.name", "no-such-model"], "is not on this machine and nothing is downloaded"),
    (["--judge.model.name", "tiny-reverse-text"], "eval starts no judge server"),
    (["--output", "."], "is a directory: name a JSON file"),
])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_served(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exit_info:
        main(["--output-dir", str(tmp_path / "run"), *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and says in err
    assert not (tmp_path / "run" / "eval").exists()


def test_a_step_retention_deleted_names_the_steps_kept(tmp_path, capsys):
    for step in (8, 9):
        (tmp_path / "run" / "weights" / f"step_{step}").mkdir(parents=True)
        (tmp_path / "run" / "weights" / f"step_{step}" / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["--output-dir", str(tmp_path / "run"), "--step", "2"])
    assert "(kept: 8, 9; the run keeps its newest trainer.keep_weights" in capsys.readouterr().err

"""An environment whose `score` raises or hangs: the rollout scores 0 with one warning line, or, with
on_error = "fail", the run stops with that line; never a traceback out of the orchestrator."""

from __future__ import annotations

import asyncio
import collections
import logging

import pytest

from prime_rl.envs import Example, Reward
from prime_rl.envs.environment import Environment
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.metrics import rollout_metrics
from prime_rl.orchestrator.rollouts import env_calls, scoring
from prime_rl.orchestrator.rollouts.env_calls import EnvironmentFailed
from prime_rl.orchestrator.rollouts.generator import GroupGenerator
from prime_rl.orchestrator.rollouts.scoring import score_group
from prime_rl.orchestrator.rollouts.seam import RolloutSettings
from prime_rl.orchestrator.rollouts.single_turn import SingleTurnRunner
from prime_rl.utils.errors import UserError

EXAMPLE = Example([{"role": "user", "content": "reverse: abc"}], "cba")


class Flaky(Environment):
    """Scores "good" 1, raises on "boom", hangs on "hang", else 0.5."""

    id = "flaky"

    def examples(self, seed=0):
        while True:
            yield EXAMPLE

    async def score(self, example, completion):
        if completion == "boom":
            raise KeyError("no such field")
        if completion == "hang":
            await asyncio.sleep(3600)
        return Reward(1.0 if completion == "good" else 0.5, {"part": 1.0})


def result(*texts: str) -> ChatResult:
    return ChatResult([1, 2], 0, [RolloutCompletion([5], [-0.1], t, "stop", [0]) for t in texts])


def score(texts, **config) -> list:
    draw = Draw("flaky", Flaky(), EXAMPLE, EnvConfig(**{"score_timeout_s": 0.2, **config}))
    return asyncio.run(score_group(draw, result(*texts)))


@pytest.mark.parametrize("on_error, outcome", [("zero", "the rollout scores 0"),
                                               ("exclude", "the rollout is left out of training")])
def test_a_raising_or_hanging_score_is_a_zero_reward_and_one_warning(on_error, outcome, caplog, monkeypatch):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())
    caplog.set_level(logging.WARNING)
    group = score(["good", "boom", "hang", "meh"], on_error=on_error)
    assert group.rewards == [1.0, 0.0, 0.0, 0.5]
    assert group.components == [{"part": 1.0}, {}, {}, {"part": 1.0}]
    assert group.errors[0] is None and group.errors[3] is None
    assert group.errors[1] == "score raised KeyError: 'no such field'"
    assert group.errors[2] == "score took longer than score_timeout_s = 0.2s"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("\n" not in w for w in warnings)
    assert all(w.startswith("environment 'flaky': score") and '"reverse: abc"' in w and outcome in w
               for w in warnings)
    metrics = rollout_metrics([group], step=0)
    assert metrics["rollout/env_error_frac"] == 0.5
    assert metrics["rollout/excluded_frac"] == (0.5 if on_error == "exclude" else 0.0)
    assert [group.trains(i) for i in range(4)] == [True, on_error == "zero", on_error == "zero", True]


def test_many_failures_are_logged_sparsely(caplog, monkeypatch):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())
    caplog.set_level(logging.WARNING)
    score(["boom"] * 120)
    counts = [int(r.getMessage().split("(failure ")[1].split(" ")[0]) for r in caplog.records]
    assert counts == [1, 2, 3, 4, 5, 10, 100]


def test_on_error_fail_stops_with_the_same_one_line():
    with pytest.raises(EnvironmentFailed, match=r"^environment 'flaky': score raised KeyError: 'no such field' "
                                                 r"\(example prompt \"reverse: abc\", answer \"cba\"\)$"):
        score(["good", "boom"], on_error="fail")
    assert issubclass(EnvironmentFailed, UserError)  # a one-line error, exit code 2


def test_env_config_rejects_bad_failure_settings():
    with pytest.raises(ValueError):
        EnvConfig(on_error="ignore")
    with pytest.raises(ValueError):
        EnvConfig(score_timeout_s=0)


class PaddedIdClient:
    """Answers with completion 1 holding a padded-row id (150) mid-way, as a server that samples every row of
    the output embedding (vLLM) can; the tokenizer has 100 ids."""

    async def chat(self, messages, n, rule, max_tokens, seed=None, template_kwargs=None):
        completions = [RolloutCompletion([5, 6, 7], [-0.1] * 3, "good", "stop", [0] * 3),
                       RolloutCompletion([5, 150, 7, 8], [-0.1] * 4, "good", "stop", [0] * 4)]
        return ChatResult([1, 2], 0, completions[:n])


def test_a_sampled_id_past_the_tokenizer_fails_its_rollout_alone(caplog, monkeypatch):
    monkeypatch.setattr(scoring, "_unsampleable", collections.Counter())
    caplog.set_level(logging.WARNING)
    settings = RolloutSettings(max_tokens=8, vocab=100)
    for on_error in ("zero", "fail"):  # the server made the id, not the environment: never a stopped run
        draw = Draw("flaky", Flaky(), EXAMPLE, EnvConfig(on_error=on_error))
        generator = GroupGenerator({"single_turn": SingleTurnRunner(PaddedIdClient())}, 2, None, settings)
        (group,) = asyncio.run(generator.generate([draw], [0]))
        assert group.rewards == [1.0, 0.0]
        assert group.errors == [None, "the server sampled token id 150, past the tokenizer's 100 ids"]
        kept, cut = group.result.completions
        assert kept.token_ids == [5, 6, 7] and cut.token_ids == [5] and cut.logprobs == [-0.1]
        assert cut.weight_steps == [0] and not cut.truncated  # a truncated_reward must not replace its 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("token id 150" in w and "\n" not in w for w in warnings)

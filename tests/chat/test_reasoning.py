"""Completions split into reasoning and answer at the `<think>` tags; the environment scores the answer and the
reasoning is counted, so a correct answer after a thought earns what it earns alone."""

from __future__ import annotations

import asyncio

import pytest

from prime_rl.chat.reasoning import Split, split_reasoning
from prime_rl.envs import load_env
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import EnvConfig, ReasoningConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.metrics import rollout_metrics
from prime_rl.orchestrator.rollouts.scoring import score_group


@pytest.mark.parametrize(("text", "expected"), [
    ("<think>\nreverse it\n</think>\n\ncba", Split("reverse it", "cba")),
    ("reverse it\n</think>\n\ncba", Split("reverse it", "cba")),  # Qwen3 put <think> in the generation prompt
    ("<think>\n\n</think>\n\ncba", Split("", "cba")),  # enable_thinking = false: an empty block
    ("  <think>a</think>b</think>c", Split("a</think>b", "c")),  # the last end tag closes it (as Qwen3 splits)
    ("<think>\nstill thinking when the budget ran out", Split("still thinking when the budget ran out", "", True)),
    ("cba", Split(None, "cba")),
    ("", Split(None, "")),
    ("the answer mentions <think> mid-way", Split(None, "the answer mentions <think> mid-way")),
])
def test_a_completion_splits_at_the_end_of_its_reasoning(text, expected):
    assert split_reasoning(text) == expected


def test_a_prompt_that_opens_the_reasoning_makes_an_unclosed_completion_unfinished():
    assert split_reasoning("maybe 42. Or 48", opened=True) == Split("maybe 42. Or 48", "", True)
    assert split_reasoning("maybe 42.</think>\n48", opened=True) == Split("maybe 42.", "48")
    assert split_reasoning("maybe 42. Or 48") == Split(None, "maybe 42. Or 48")


def test_other_tags_split_the_same_way():
    assert split_reasoning("[R]plan[/R] 42", "[R]", "[/R]") == Split("plan", "42")
    assert split_reasoning("<think>x</think> 42", "[R]", "[/R]") == Split(None, "<think>x</think> 42")


def score(texts, reasoning):
    env = load_env("reverse-text")
    example = next(env.examples(seed=0))
    answer = example.answer
    result = ChatResult([1], 0, [RolloutCompletion([5], [-0.1], t.format(answer=answer), "stop", [0]) for t in texts])
    return asyncio.run(score_group(Draw("reverse-text", env, example, EnvConfig()), result, reasoning=reasoning))


def test_the_reward_scores_the_answer_and_the_reasoning_is_counted():
    texts = ["<think>\nI reverse the letters one by one.\n</think>\n\n{answer}", "{answer}", "<think>\nno time"]
    group = score(texts, ReasoningConfig())
    assert group.rewards[0] == group.rewards[1] == 1.0  # thinking first costs nothing
    assert group.rewards[2] < 1.0  # the budget ran out while thinking: an empty answer
    metrics = rollout_metrics([group], step=0)
    assert metrics["rollout/reasoning_chars_mean"] == pytest.approx((len("I reverse the letters one by one.")
                                                                     + len("no time")) / 3)
    assert metrics["rollout/unfinished_reasoning_frac"] == pytest.approx(1 / 3)
    unparsed = score(texts, ReasoningConfig(parser="none"))
    assert unparsed.rewards[0] < 0.5 and unparsed.rewards[1] == 1.0  # the think block is scored as the answer
    assert rollout_metrics([unparsed], step=0)["rollout/reasoning_chars_mean"] == 0


def test_an_empty_end_tag_is_refused():
    with pytest.raises(ValueError, match="end_tag"):
        ReasoningConfig(end_tag="")

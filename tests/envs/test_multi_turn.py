"""`reverse-text-hint`: a right first attempt ends the rollout, a wrong one gets the first half of the answer;
both attempts are scored; SFT demonstrations hold a flawed first attempt as context only."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from prime_rl.envs import load_env
from prime_rl.envs.environment import Rollout
from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.trainer.sft.data import sft_chat, tokenize_conversation
from prime_rl.utils.errors import UserError


@pytest.fixture
def env():
    return load_env("reverse-text-hint", min_len=5, max_len=12)


def test_a_wrong_first_attempt_gets_half_the_answer_and_a_right_one_ends(env):
    example = next(env.examples(seed=3))
    assert env.multi_turn and env.max_turns == 2
    right = asyncio.run(env.respond(example, [{"role": "assistant", "content": f" {example.answer}\n"}], {}))
    assert right.done and not right.messages
    wrong = asyncio.run(env.respond(example, [{"role": "assistant", "content": "nope"}], {}))
    half = example.answer[: (len(example.answer) + 1) // 2]
    assert not wrong.done and wrong.messages == [{"role": "user", "content": half}]


def test_the_reward_is_the_mean_of_both_attempts(env):
    example = next(env.examples(seed=3))
    messages = [{"role": "assistant", "content": "zz"}, {"role": "user", "content": "h"},
                {"role": "assistant", "content": example.answer}]
    reward = asyncio.run(env.score_rollout(example, Rollout(messages)))
    assert reward.components["final"] == 1.0 and reward.components["first"] < 0.5
    assert reward.total == pytest.approx((1.0 + reward.components["first"]) / 2)
    right = asyncio.run(env.score_rollout(example, Rollout([{"role": "assistant", "content": example.answer}])))
    assert right.total == 1.0
    assert asyncio.run(env.score_rollout(example, Rollout([]))).total == 0.0


def test_demonstrations_correct_a_flawed_first_attempt_that_is_not_trained():
    env = load_env("reverse-text-hint", demo_retry_prob=1.0)
    tokenizer = build_char_tokenizer()
    for example in itertools.islice(env.examples(seed=0), 20):
        first, hint, final = env.demonstration(example)
        assert first["train"] is False and first["content"] != example.answer
        assert len(first["content"]) == len(example.answer)
        assert hint == {"role": "user", "content": example.answer[: (len(example.answer) + 1) // 2]}
        assert final == {"role": "assistant", "content": example.answer}
        # The hint is exactly what the environment answers to that first attempt.
        reply = asyncio.run(env.respond(example, [first], {}))
        assert reply.messages == [hint]
        sample = tokenize_conversation(sft_chat(tokenizer), [*example.prompt, first, hint, final])
        trained = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask, strict=True) if m])
        assert trained == f"{example.answer}<|im_end|>"
    plain = load_env("reverse-text-hint", demo_retry_prob=0.0)
    example = next(plain.examples(seed=0))
    assert plain.demonstration(example) == [{"role": "assistant", "content": example.answer}]


def test_demo_retry_prob_outside_0_1_is_a_user_error():
    with pytest.raises(UserError, match="demo_retry_prob must be in"):
        load_env("reverse-text-hint", demo_retry_prob=1.5)

"""Multi-turn rollouts against a scripted server: every turn's prompt is the exact ids so far, the sample's mask
covers only sampled tokens, limits end a rollout as the docs say, and a failing environment fails one rollout."""

from __future__ import annotations

import asyncio
import collections
import itertools

import pytest

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.envs.environment import EnvReply, Example, MultiTurnEnvironment, Reward
from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.batch import Sample, pack_batch
from prime_rl.orchestrator.client import ChatResult, RolloutCompletion
from prime_rl.orchestrator.config import EnvConfig
from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.orchestrator.metrics import rollout_metrics
from prime_rl.orchestrator.rollouts import env_calls
from prime_rl.orchestrator.rollouts.env_calls import EnvironmentFailed
from prime_rl.orchestrator.rollouts.generator import GroupGenerator
from prime_rl.orchestrator.rollouts.multi_turn import ConversationRunner
from prime_rl.orchestrator.rollouts.seam import RolloutSettings

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
EXAMPLE = Example([{"role": "user", "content": "hi"}], "ok")


class ToolEcho(MultiTurnEnvironment):
    """Answers every policy turn with a tool message (a tool call counted, `bad_json` on turn 2), done after
    `max_turns`; raises or hangs when the policy says "boom" or "hang". Reward: turns / 10."""

    id = "tool-echo"
    max_turns = 3

    def examples(self, seed=0):
        return itertools.repeat(EXAMPLE)

    async def respond(self, example, messages, state):
        last = messages[-1]["content"]
        if last == "boom":
            raise RuntimeError("the tool server is down")
        if last == "hang":
            await asyncio.sleep(3600)
        state["calls"] = state.get("calls", 0) + 1
        errors = ("bad_json",) if state["calls"] == 2 else ()
        return EnvReply([{"role": "tool", "content": f"r{state['calls']}"}], tool_calls=1, tool_errors=errors)

    async def score_rollout(self, example, rollout):
        return Reward(rollout.turns / 10)


class ScriptedServer:
    """Completions endpoint: answers with the next scripted text (+ end of turn, or cut at max_tokens), logprob
    -0.25 per token, weight step 3; records every prompt."""

    def __init__(self, texts):
        self.texts = iter(texts)
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []

    async def complete(self, prompt_ids, n, rule, max_tokens, seed=None):
        self.prompts.append(list(prompt_ids))
        self.max_tokens.append(max_tokens)
        choices = []
        for _ in range(n):
            text = next(self.texts)
            ids = TOKENIZER(text, add_special_tokens=False)["input_ids"] + [EOS]
            reason = "stop"
            if len(ids) > max_tokens:
                ids, reason = ids[:max_tokens], "length"
            choices.append(RolloutCompletion(ids, [-0.25] * len(ids), TOKENIZER.decode(ids, skip_special_tokens=True),
                                      reason, [3] * len(ids)))
        return ChatResult(list(prompt_ids), 3, choices)


def run(texts, n=1, seq_len=512, max_tokens=16, env=None, **config):
    server = ScriptedServer(texts)
    runner = ConversationRunner(server, ChatTokens(TOKENIZER), seq_len)
    draw = Draw("tool-echo", env or ToolEcho(), EXAMPLE, EnvConfig(**{"respond_timeout_s": 0.3, **config}))
    settings = RolloutSettings(max_tokens)
    generator = GroupGenerator({"multi_turn": runner}, n, SamplingRule(), settings)
    (group,) = asyncio.run(generator.generate([draw], [7]))
    return server, group


def test_each_turn_is_prompted_with_the_exact_ids_so_far():
    server, group = run(["one", "two", "three"])
    (completion,) = group.result.completions
    prompt = group.result.prompt_token_ids
    assert len(server.prompts) == 3
    for turn_prompt, next_prompt in itertools.pairwise(server.prompts):
        assert next_prompt[:len(turn_prompt)] == turn_prompt  # each turn extends the ids before it
    assert server.prompts[0] == prompt
    assert server.prompts[2] == prompt + completion.token_ids[:len(server.prompts[2]) - len(prompt)]
    text = TOKENIZER.decode(prompt + completion.token_ids)
    assert text == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\none<|im_end|>\n<|im_start|>tool\nr1"
                    "<|im_end|>\n<|im_start|>assistant\ntwo<|im_end|>\n<|im_start|>tool\nr2<|im_end|>\n"
                    "<|im_start|>assistant\nthree<|im_end|>")
    # The mask is true exactly on the sampled tokens, which carry the server's logprobs and weight steps.
    sampled = [t for t, m in zip(completion.token_ids, completion.mask, strict=True) if m]
    assert TOKENIZER.decode(sampled) == "one<|im_end|>two<|im_end|>three<|im_end|>"
    env_logprobs = [lp for lp, m in zip(completion.logprobs, completion.mask, strict=True) if not m]
    assert env_logprobs == [0.0] * (len(completion.token_ids) - len(sampled))
    assert completion.weight_steps == [3] * len(sampled)
    assert group.rewards == [0.3]
    (stats,) = group.stats
    assert (stats.turns, stats.tool_calls, stats.tool_errors["bad_json"], stats.env_calls) == (3, 2, 1, 2)
    metrics = rollout_metrics([group], step=3)
    assert metrics["rollout/turns_mean"] == 3 and metrics["rollout/tool_calls_mean"] == 2
    assert metrics["rollout/tool_errors/bad_json"] == 1 and metrics["rollout/tool_errors/timeout"] == 0
    assert metrics["rollout/sampled_token_frac"] == pytest.approx(len(sampled) / len(completion.token_ids))


def test_environment_tokens_never_carry_loss_in_the_packed_batch():
    _, group = run(["one", "two", "three", "uno", "dos", "tres"], n=2)
    result = group.result
    samples = [Sample(result.prompt_token_ids, c.token_ids, c.logprobs, 1.5, 3, True, c.mask)
               for c in result.completions]
    (batch,) = pack_batch(samples, seq_len=512, world_size=1, step=3, rule=SamplingRule(), max_tokens=16)
    (mb,) = batch.micro_batches
    trained = mb.input_ids[mb.loss_mask]
    turns = TOKENIZER.decode(trained.tolist()).split("<|im_end|>")  # the two rollouts' turns interleave
    assert sorted(turns) == sorted(["one", "two", "three", "uno", "dos", "tres", ""])
    assert bool((mb.inference_logprobs[~mb.loss_mask] == 0).all() and (mb.advantages[~mb.loss_mask] == 0).all())
    assert bool((mb.inference_logprobs[mb.loss_mask] == -0.25).all() and (mb.advantages[mb.loss_mask] == 1.5).all())
    # No tool or template token is trained, although they lie between trained ones.
    assert TOKENIZER.convert_tokens_to_ids("<|im_start|>") not in trained.tolist()


def test_max_turns_override_and_a_turn_cut_by_max_tokens_end_the_rollout():
    server, group = run(["one", "two"], max_turns=1)
    assert len(server.prompts) == 1 and group.stats[0].turns == 1
    server, group = run(["a much longer answer"], max_tokens=5)
    assert len(server.prompts) == 1 and group.result.completions[0].truncated


def test_a_conversation_that_would_outgrow_seq_len_ends_truncated_by_context():
    server, _ = run(["one", "two", "three"])
    second_prompt = len(server.prompts[1])  # prompt + first turn + the reply's tail
    # No room for a single token of the second turn: it is not asked for, the reply is dropped.
    server, group = run(["one", "two"], seq_len=second_prompt)
    (completion,) = group.result.completions
    assert len(server.prompts) == 1 and completion.truncated and group.stats[0].context_truncated
    assert group.stats[0].env_tokens == 0 and len(group.result.prompt_token_ids) + len(completion.token_ids) < 30
    assert rollout_metrics([group], 0)["rollout/context_truncated_frac"] == 1.0
    # Room for 3 tokens: the second turn's max_tokens is cut to them, and the sample fits seq_len exactly.
    server, group = run(["one", "twotwotwo"], seq_len=second_prompt + 3)
    assert server.max_tokens == [16, 3]
    assert len(group.result.prompt_token_ids) + len(group.result.completions[0].token_ids) == second_prompt + 3
    assert group.result.completions[0].truncated and not group.stats[0].context_truncated


@pytest.mark.parametrize("text, why", [("boom", "respond raised RuntimeError: the tool server is down"),
                                       ("hang", "respond took longer than respond_timeout_s = 0.3s")])
@pytest.mark.slow
def test_an_environment_that_raises_or_hangs_fails_its_rollout_alone(text, why, monkeypatch, caplog):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())
    _, group = run([text, "fine", "two", "three"], n=2)
    assert group.errors == [why, None]
    assert group.rewards == [0.0, 0.3]
    assert sum("the rollout is left out of training" in r.getMessage() for r in caplog.records) == 1
    assert not group.trains(0) and group.trains(1)
    _, group = run([text, "fine", "two", "three"], n=2, on_error="zero")
    assert group.rewards == [0.0, 0.3] and group.trains(0)
    assert sum("the rollout scores 0" in r.getMessage() for r in caplog.records) == 1
    with pytest.raises(EnvironmentFailed, match=why):
        run([text, "fine", "two", "three"], n=2, on_error="fail")


def test_score_group_rewards_the_group_together():
    class Ranked(ToolEcho):
        async def score_group(self, example, rollouts):
            order = sorted(range(len(rollouts)), key=lambda i: len(rollouts[i].completion))
            return [Reward(float(order.index(i))) for i in range(len(rollouts))]

    _, group = run(["bb", "a", "x", "y", "z", "w"], n=2, env=Ranked(), max_turns=1)
    assert group.rewards == [1.0, 0.0]


class Hostile(ToolEcho):
    """Answers what `answer` says: a malformed reply, or one the chat template cannot render."""

    def __init__(self, answer):
        self.answer = answer

    async def respond(self, example, messages, state):
        return self.answer


@pytest.mark.parametrize("answer, why", [
    (None, "respond returned a NoneType, not an EnvReply"),
    ({"messages": []}, "respond returned a dict, not an EnvReply"),
    (EnvReply(["hello"]), "respond returned a message that is not a dict"),
    (EnvReply([{"role": "tool", "content": None}]), "respond returned a message that is not a dict"),
    (EnvReply([{"role": "user", "content": "x"}], tool_errors="timeout"), "respond returned tool_calls that is not"),
    (EnvReply([{"role": "tool", "content": "bad \udcff name"}]), "respond's reply cannot be rendered"),
])
def test_a_malformed_reply_fails_its_rollout_not_the_run(answer, why, monkeypatch):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())
    _, group = run(["one", "two"], env=Hostile(answer))
    assert group.errors[0].startswith(why) and group.rewards == [0.0]


@pytest.mark.parametrize("rewards, why", [
    ([Reward(float("nan")), Reward(1.0)], "score_group returned a reward whose total is nan"),
    ([1.0, 1.0], "score_group returned a float where a Reward belongs"),
    ((r for r in ()), "score_group returned a generator, not a list of Rewards"),
    ([Reward(1.0)], "score_group returned 1 rewards for 2 rollouts"),
])
def test_score_group_answers_that_are_no_finite_rewards_fail_the_group(rewards, why, monkeypatch):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())

    class Bad(ToolEcho):
        async def score_group(self, example, rollouts):
            return rewards

    _, group = run(["a", "b"], n=2, env=Bad(), max_turns=1)
    assert [e.startswith(why) for e in group.errors] == [True, True] and group.rewards == [0.0, 0.0]


def test_a_non_finite_or_non_reward_score_fails_that_rollout(monkeypatch):
    monkeypatch.setattr(env_calls, "_failures", collections.Counter())

    class Bad(ToolEcho):
        async def score_rollout(self, example, rollout):
            return Reward(float("inf")) if rollout.completion == "a" else 0.5

    _, group = run(["a", "b"], n=2, env=Bad(), max_turns=1)
    assert group.errors == ["score returned a reward whose total is inf, not a finite number",
                            "score returned a float where a Reward belongs"]
    assert group.rewards == [0.0, 0.0]

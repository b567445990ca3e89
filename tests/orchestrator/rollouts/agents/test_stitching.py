"""An agent's calls stitched into segments (`rollouts/agents/stitching.py`), with the real Qwen3 and Llama 3
tokenizers and chat templates: calls that extend the conversation stay one segment whose ids are the sampled ones
plus template tails, and every history edit starts a new segment instead of training on ids that were not sampled
under their prompt."""

from __future__ import annotations

import functools
import json

import pytest

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.orchestrator.client import RolloutCompletion
from prime_rl.orchestrator.rollouts.agents.stitching import SessionStitcher, canonical
from tests.support.agent_sessions import sampled_runs
from tests.support.real_tokenizers import load_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
CALL = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}


@functools.cache
def chat_of(name: str) -> ChatTokens:
    """One tokenizer load per name and worker (the Qwen3 one takes about a second)."""
    return ChatTokens(load_tokenizer(name))


@pytest.fixture(params=["qwen3", "llama3"])
def chat(request) -> ChatTokens:
    return chat_of(request.param)


class Policy:
    """Stands in for the server: the ids of a reply are what the template writes for it as a conversation's last
    turn, up to and including the first end-of-turn token (where a sampler stops); each call's logprobs and weight
    step are distinct, so a test can find them again."""

    def __init__(self, chat: ChatTokens):
        self.chat, self.calls = chat, 0

    def reply(self, messages: list[dict], reply: dict, tools=None) -> RolloutCompletion:
        ids = self.chat.turn_ids([*messages, reply], tools or [])
        end = next(i for i, token in enumerate(ids) if token in self.chat.end_of_turn)
        self.calls += 1
        ids = ids[:end + 1]
        return RolloutCompletion(ids, [-0.01 * self.calls] * len(ids), reply.get("content") or "", "stop",
                                 [self.calls] * len(ids))


def converse(stitcher: SessionStitcher, policy: Policy, messages: list[dict], reply: dict, tools=None
             ) -> tuple[list[int], RolloutCompletion]:
    prompt = stitcher.begin_call(messages, tools)
    sampled = policy.reply(messages, reply, tools)
    stitcher.end_call(sampled, reply)
    return prompt, sampled



@pytest.mark.slow
def test_calls_that_extend_the_conversation_are_one_segment_of_the_sampled_ids(chat):
    stitcher, policy = SessionStitcher(chat), Policy(chat)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    replies = [{"role": "assistant", "content": "Hi there."}, {"role": "assistant", "content": "Bye now."},
               {"role": "assistant", "content": "Done."}]
    samples = []
    for i, reply in enumerate(replies):
        prompt, sampled = converse(stitcher, policy, messages, reply)
        samples.append(sampled)
        segment = stitcher.segments[-1]
        assert prompt == segment.prompt_ids + segment.record.token_ids[:len(prompt) - len(segment.prompt_ids)]
        messages = [*messages, reply, {"role": "user", "content": f"Again {i}."}]
    (segment,) = stitcher.segments
    assert not stitcher.forks and segment.calls == 3
    assert sampled_runs(segment.record) == [s.token_ids for s in samples]  # exactly what was sampled, in order
    assert segment.record.weight_steps == [step for s in samples for step in s.weight_steps]
    assert [lp for lp, keep in zip(segment.record.logprobs, segment.record.mask, strict=True) if keep] == \
        [lp for s in samples for lp in s.logprobs]
    assert all(lp == 0.0 for lp, keep in zip(segment.record.logprobs, segment.record.mask, strict=True) if not keep)
    # Plain text turns: the stitched ids read as the template renders the whole conversation, but for the empty
    # reasoning block Qwen3 writes into each sampled turn and drops from earlier turns when it re-renders them.
    def unthought(text: str) -> str:
        return text.replace("<think>\n\n</think>\n\n", "")

    whole = chat.render(messages[:-1], [], generation_prompt=False)
    stitched = chat.tokenizer.decode(segment.prompt_ids + segment.record.token_ids)
    assert unthought(stitched) == unthought(whole).removesuffix("\n")


def test_a_tool_call_and_its_result_extend_the_segment_however_the_sdk_spells_them():
    chat = chat_of("qwen3")  # Llama 3's template does not render tool calls
    stitcher, policy = SessionStitcher(chat), Policy(chat)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    call = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    converse(stitcher, policy, messages, call, TOOLS)
    # The SDK replays the call with its arguments as an object, extra keys and "" for null content.
    replayed = {"role": "assistant", "content": "", "refusal": None,
                "tool_calls": [{**CALL, "function": {"name": "add", "arguments": {"b": 3, "a": 2}}}]}
    assert canonical(replayed) == canonical(call)
    messages = [*messages, replayed, {"role": "tool", "tool_call_id": "call_0", "content": "5"}]
    prompt, _ = converse(stitcher, policy, messages, {"role": "assistant", "content": "5."}, TOOLS)
    (segment,) = stitcher.segments
    assert not stitcher.forks and segment.calls == 2
    assert "<tool_response>\n5\n</tool_response>" in chat.tokenizer.decode(prompt)


@pytest.mark.parametrize("edit, reason", [
    ("retry", "retry"),
    ("drop_first_user", "history_edit"),
    ("change_tool_result", "history_edit"),
    ("drop_reasoning", "reply_edit"),
    ("change_reply", "reply_edit"),
    ("insert_assistant", "reply_edit"),
    ("other_tools", "tools"),
])
def test_every_history_edit_starts_a_new_segment_and_keeps_the_sampled_ids(edit, reason):
    chat = chat_of("qwen3")
    stitcher, policy = SessionStitcher(chat), Policy(chat)
    first = [{"role": "user", "content": "What is 2 + 3?"}]
    call = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    converse(stitcher, policy, first, call, TOOLS)
    history = [*first, call, {"role": "tool", "tool_call_id": "call_0", "content": "5"}]
    answer = {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 + 3 = 5"}
    _, before = converse(stitcher, policy, history, answer, TOOLS)
    follow = [*history, answer, {"role": "user", "content": "And 5 + 5?"}]
    tools = TOOLS
    if edit == "retry":
        follow = history
    elif edit == "drop_first_user":
        follow = follow[1:]
    elif edit == "change_tool_result":
        follow[2] = {**follow[2], "content": "6"}
    elif edit == "drop_reasoning":  # what Qwen3's template does to earlier turns
        follow[3] = {"role": "assistant", "content": "It is 5."}
    elif edit == "change_reply":
        follow[3] = {**answer, "content": "It is five."}
    elif edit == "insert_assistant":
        follow = [*follow[:-1], {"role": "assistant", "content": "Anything else?"}, follow[-1]]
    elif edit == "other_tools":
        tools = [*TOOLS, {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}]
    prompt, _ = converse(stitcher, policy, follow, {"role": "assistant", "content": "10."}, tools)
    assert dict(stitcher.forks) == {reason: 1}
    old, new = stitcher.segments
    assert old.calls == 2 and new.calls == 1
    assert sampled_runs(old.record)[-1] == before.token_ids  # the earlier segment trains on what it sampled
    assert new.prompt_ids == prompt == chat.prompt_ids(follow, tools)  # a fresh rendering, nothing stitched


def test_a_fork_then_extension_continues_the_new_segment():
    chat = chat_of("llama3")
    stitcher, policy = SessionStitcher(chat), Policy(chat)
    converse(stitcher, policy, [{"role": "user", "content": "a"}], {"role": "assistant", "content": "b"})
    summary = [{"role": "user", "content": "summary: a, b"}]  # the agent summarised its history
    converse(stitcher, policy, summary, {"role": "assistant", "content": "c"})
    converse(stitcher, policy, [*summary, {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}],
             {"role": "assistant", "content": "e"})
    assert dict(stitcher.forks) == {"history_edit": 1}
    assert [s.calls for s in stitcher.segments] == [1, 2]


def test_calls_must_alternate_begin_and_end():
    chat = chat_of("llama3")
    stitcher = SessionStitcher(chat)
    with pytest.raises(RuntimeError, match="end_call without begin_call"):
        stitcher.end_call(RolloutCompletion([1], [0.0], "", "stop", [0]), {"role": "assistant", "content": ""})
    stitcher.begin_call([{"role": "user", "content": "a"}])
    with pytest.raises(RuntimeError, match="before the previous call's end_call"):
        stitcher.begin_call([{"role": "user", "content": "a"}])


def test_canonical_messages_compare_what_the_template_renders():
    text_parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert canonical(text_parts) == canonical({"role": "user", "content": "ab"})
    assert canonical({"role": "assistant", "content": "x", "reasoning": "r"}) == \
        canonical({"role": "assistant", "content": "x", "reasoning_content": "r"})
    assert canonical({"role": "assistant", "content": "x"}) != canonical({"role": "assistant", "content": "x",
                                                                           "reasoning_content": "r"})
    bad_json = {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "add", "arguments": "{oops"}}]}
    assert json.loads(canonical(bad_json)[3][0][2]) == "{oops"  # text that is no JSON stays text

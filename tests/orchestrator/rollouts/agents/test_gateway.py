"""The rollout-session gateway (`rollouts/agents/gateway.py`) as the real `openai` client sees it, with the real
Qwen3 tokenizer and template: what an agent reads, what the session records (token-exact), streaming, isolation
between sessions, and failures."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import pytest

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.config import ReasoningConfig
from prime_rl.orchestrator.rollouts.agents.gateway import AgentGateway
from tests.support.agent_sessions import TOOLS, ScriptedServer, qwen3, sampled_runs


def gateway_for(reply, reasoning: ReasoningConfig | None = None, seq_len: int = 4096
                ) -> tuple[AgentGateway, ScriptedServer]:
    server = ScriptedServer(reply)
    return AgentGateway(server, qwen3(), seq_len, "policy", reasoning), server


def agent(gateway: AgentGateway, session) -> openai.AsyncOpenAI:
    """The `openai` client an agent would build from the session's URL and key (served in this process)."""
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)  # a 500 answers, as a server does
    return openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key, max_retries=0,
                              http_client=httpx.AsyncClient(transport=transport))


def replayed(message) -> dict:
    """The assistant message as an agent puts it back into its history."""
    return message.model_dump(exclude_none=True)



@pytest.mark.slow
def test_a_plain_openai_agent_over_four_turns_trains_on_exactly_what_was_sampled():
    gateway, server = gateway_for(lambda prompt: f"Turn {prompt.count('<|im_start|>user')}.")

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64, seed=7)
        client = agent(gateway, session)
        messages = [{"role": "system", "content": "Be brief."}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"Question {turn}?"})
            answer = await client.chat.completions.create(model="policy", messages=messages)
            assert answer.choices[0].message.content == f"Turn {turn + 1}."
            messages.append(replayed(answer.choices[0].message))
        return gateway.close_session(session.id).stitcher

    stitcher = asyncio.run(run())
    (segment,) = stitcher.segments
    assert segment.calls == 4 and not stitcher.forks
    assert sampled_runs(segment.record) == server.sampled
    assert segment.record.weight_steps == [step for i, ids in enumerate(server.sampled, 1) for step in [i] * len(ids)]


TOOL_CALLS = ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
              '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>')


def test_parallel_tool_calls_reach_the_agent_and_their_results_extend_the_segment():
    gateway, server = gateway_for(lambda prompt: "5 and 2." if "<tool_response>" in prompt else TOOL_CALLS)

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        client = agent(gateway, session)
        messages = [{"role": "user", "content": "2 + 3 and 1 + 1?"}]
        first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        calls = choice.message.tool_calls
        assert [(c.function.name, c.function.arguments) for c in calls] == [
            ("add", '{"a": 2, "b": 3}'), ("add", '{"a": 1, "b": 1}')]
        messages.append(replayed(choice.message))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in zip(calls, ("5", "2"),
                                                                                          strict=True)]
        second = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == "5 and 2."
        return gateway.close_session(session.id).stitcher

    stitcher = asyncio.run(run())
    (segment,) = stitcher.segments
    assert not stitcher.forks and sampled_runs(segment.record) == server.sampled


def test_reasoning_is_split_off_and_replaying_without_it_starts_a_new_segment():
    reply = "<think>\nCount the letters.\n</think>\n\nThree."
    gateway, _ = gateway_for(lambda prompt: reply, ReasoningConfig())

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        client = agent(gateway, session)
        messages = [{"role": "user", "content": "How many?"}]
        answer = (await client.chat.completions.create(model="policy", messages=messages)).choices[0].message
        assert answer.content == "Three."
        assert answer.model_extra["reasoning_content"] == answer.model_extra["reasoning"] == "Count the letters."
        kept = [*messages, replayed(answer), {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model="policy", messages=kept)  # extends
        dropped = [*kept, {"role": "assistant", "content": "Three."}, {"role": "user", "content": "Really?"}]
        await client.chat.completions.create(model="policy", messages=dropped)  # the thinking left out: a fork
        return gateway.close_session(session.id).stitcher

    stitcher = asyncio.run(run())
    assert dict(stitcher.forks) == {"reply_edit": 1} and [s.calls for s in stitcher.segments] == [2, 1]


def test_a_streamed_answer_reads_as_the_same_answer():
    gateway, _ = gateway_for(lambda prompt: "<think>\nhm\n</think>\n\nSure. " + TOOL_CALLS, ReasoningConfig())

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        client = agent(gateway, session)
        messages = [{"role": "user", "content": "Add."}]
        whole = (await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)).choices[0]
        stream = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, stream=True)
        content, reasoning, calls, finish = "", "", {}, None
        async for chunk in stream:
            delta = chunk.choices[0].delta
            content += delta.content or ""
            reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
            for call in delta.tool_calls or ():
                calls[call.index] = (call.id, call.function.name, call.function.arguments)
            finish = chunk.choices[0].finish_reason or finish
        assert content == whole.message.content == "Sure."
        assert reasoning == whole.message.model_extra["reasoning_content"] == "hm"
        assert [calls[i][1:] for i in sorted(calls)] == [(c.function.name, c.function.arguments)
                                                        for c in whole.message.tool_calls]
        ids = [calls[i][0] for i in sorted(calls)] + [c.id for c in whole.message.tool_calls]
        assert len(set(ids)) == 4 and all(i.startswith("call_") for i in ids)  # unique in the session
        assert finish == whole.finish_reason == "tool_calls"

    asyncio.run(run())


def test_a_key_opens_its_own_session_only_and_none_after_it_ended():
    gateway, _ = gateway_for(lambda prompt: "ok")

    async def run():
        a, b = gateway.open_session(SamplingRule(1.0), 64), gateway.open_session(SamplingRule(1.0), 64)
        messages = [{"role": "user", "content": "hi"}]
        crossed = agent(gateway, a).with_options(base_url=b.base_url)  # A's key on B's URL
        with pytest.raises(openai.AuthenticationError, match="invalid API key for this session"):
            await crossed.chat.completions.create(model="policy", messages=messages)
        await agent(gateway, b).chat.completions.create(model="policy", messages=messages)
        gateway.close_session(a.id)
        with pytest.raises(openai.AuthenticationError):
            await agent(gateway, a).chat.completions.create(model="policy", messages=messages)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as raw:  # no key at all
            answer = await raw.get(f"{b.base_url}/models")
            assert answer.status_code == 401 and "error" in answer.json()
            answer = await raw.get(f"{b.base_url}/models", headers={"Authorization": f"Bearer {b.key}"})
            assert answer.json()["data"][0]["id"] == "policy"
        return gateway.close_session(b.id).stitcher

    assert asyncio.run(run()).segments[0].calls == 1


def test_the_gateway_answers_in_the_servers_shapes():
    """The envelope, usage and model card come from `openai_api.http_api`, as the inference server's do: the same
    top-level keys, the served weight step and prompt ids, each choice's token ids and their weight steps."""
    from prime_rl.openai_api.http_api import answer, model_card

    gateway, server = gateway_for(lambda prompt: "ok")

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app)) as raw:
            auth = {"Authorization": f"Bearer {session.key}"}
            chat = await raw.post(f"{session.base_url}/chat/completions", headers=auth,
                                  json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
            models = await raw.get(f"{session.base_url}/models", headers=auth)
        return chat.json(), models.json()

    chat, models = asyncio.run(run())
    assert set(chat) == set(answer("chat.completion", "policy", [1], 0, []))
    (choice,) = chat["choices"]
    assert chat["weight_step"] == 1 and chat["prompt_token_ids"] and choice["token_ids"] == server.sampled[0]
    assert choice["token_weight_steps"] == [1] * len(choice["token_ids"])
    assert chat["usage"] == {"prompt_tokens": len(chat["prompt_token_ids"]), "completion_tokens": len(
        choice["token_ids"]), "total_tokens": len(chat["prompt_token_ids"]) + len(choice["token_ids"])}
    assert models == model_card("policy", 4096)


@pytest.mark.slow
def test_two_hundred_concurrent_sessions_keep_every_call_in_its_own_rollout():
    gateway, _ = gateway_for(lambda prompt: "echo " + re.findall(r"rollout \d+", prompt)[-1])

    async def one(i: int) -> tuple[int, object]:
        session = gateway.open_session(SamplingRule(1.0), 64)
        client = agent(gateway, session)
        messages = [{"role": "user", "content": f"rollout {i}"}]
        for _ in range(2):
            answer = await client.chat.completions.create(model="policy", messages=messages)
            assert answer.choices[0].message.content == f"echo rollout {i}"
            messages += [replayed(answer.choices[0].message), {"role": "user", "content": f"rollout {i}"}]
        return i, gateway.close_session(session.id).stitcher

    async def run():
        return await asyncio.gather(*(one(i) for i in range(200)))

    for i, stitcher in asyncio.run(run()):
        (segment,) = stitcher.segments
        text = qwen3().tokenizer.decode([id_ for run in sampled_runs(segment.record) for id_ in run])
        assert segment.calls == 2 and text == f"echo rollout {i}<|im_end|>" * 2
    assert not gateway.sessions


def test_what_a_session_cannot_serve_is_an_openai_error_and_a_failed_call_leaves_no_trace():
    gateway, server = gateway_for(lambda prompt: "ok")

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        client = agent(gateway, session)
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError, match="n must be 1 in a rollout session"):
            await client.chat.completions.create(model="policy", messages=messages, n=2)
        server.fail = True
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="policy", messages=messages)
        server.fail = False
        await client.chat.completions.create(model="policy", messages=messages)  # the agent retries
        return gateway.close_session(session.id).stitcher

    stitcher = asyncio.run(run())
    assert [s.calls for s in stitcher.segments] == [1] and not stitcher.forks


def test_a_conversation_that_fills_the_context_is_refused_before_anything_is_generated():
    gateway, server = gateway_for(lambda prompt: "ok", seq_len=12)

    async def run():
        session = gateway.open_session(SamplingRule(1.0), 64)
        with pytest.raises(openai.BadRequestError, match=r"conversation \(\d+ tokens\) fills the context length 12"):
            await agent(gateway, session).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "a question longer than the context"}])
        return gateway.close_session(session.id).stitcher

    assert asyncio.run(run()).segments == [] and server.calls == 0

"""The rollout-session gateway in front of the real builtin inference server (fp32): an `openai` agent's four
turns are one segment whose sampled tokens carry, in the stitched sequence, the logprobs the server sampled them
with, so the trainer's ratio to the sampler is 1 on every trained token (the mismatch it would log is 0)."""

from __future__ import annotations

import asyncio
import math

import httpx
import openai
import pytest

from prime_rl.chat.template_tokens import ChatTokens
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.orchestrator.client import InferenceClient
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.orchestrator.rollouts.agents.gateway import AgentGateway
from tests.support.agent_sessions import sampled_runs
from tests.support.inference_server import start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server_url(tiny_model_dir, tmp_path_factory):
    proc, url = start_server(tiny_model_dir, tmp_path_factory.mktemp("server") / "inference.log", "builtin", 0, 120,
                             "--builtin.dtype", "float32", seq_len=512)
    yield url
    stop_server(proc)


def test_an_openai_agent_through_the_gateway_trains_on_the_servers_own_tokens_and_logprobs(tiny_model_dir,
                                                                                           server_url):
    async def run():
        async with InferenceClient(ClientConfig(base_url=f"{server_url}/v1")) as client:
            gateway = AgentGateway(client, ChatTokens.load(tiny_model_dir), 512, "tiny")
            session = gateway.open_session(SamplingRule(1.0), 12, seed=3)
            transport = httpx.ASGITransport(app=gateway.app)
            agent = openai.AsyncOpenAI(base_url=session.base_url, api_key=session.key, max_retries=0,
                                       http_client=httpx.AsyncClient(transport=transport))
            messages = []
            for turn in range(4):
                messages.append({"role": "user", "content": f"reverse: abc{turn}"})
                answer = await agent.chat.completions.create(model="tiny", messages=messages)
                messages.append(answer.choices[0].message.model_dump(exclude_none=True))
            segments = gateway.close_session(session.id).stitcher.segments
            (segment,) = segments
            # Score the stitched sequence as the trainer would: each token's logprob given every token before it.
            (scored,) = await client.score_many([segment.prompt_ids + segment.record.token_ids], 1.0)
            return segment, scored

    segment, scored = asyncio.run(run())
    assert segment.calls == 4 and len(sampled_runs(segment.record)) == 4
    start, record = len(segment.prompt_ids), segment.record
    sampled = [(scored[start + i - 1], lp) for i, (lp, keep) in enumerate(zip(record.logprobs, record.mask,
                                                                                strict=True)) if keep]
    mismatch = sum(math.exp(q - p) - (q - p) - 1 for p, q in sampled) / len(sampled)  # k3 of log r = p - q
    assert max(abs(p - q) for p, q in sampled) < 1e-4 and mismatch < 1e-6

"""The builtin server under attack: the bad-request probe, code in update directories, big bodies.

One server (tiny model, an API key, one allowed weight root, trust_remote_code on, so an
update directory's code *could* run if anything loaded it as a model) answers everything.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest

from prime_rl.models.sampling_rule import SamplingRule
from tests.support.inference_probe import probe_server, request_probes, weight_probes
from tests.support.inference_server import builtin_server, make_weight_root
from tests.support.weight_dirs import mismatched_dirs

pytestmark = pytest.mark.slow  # servers or scripts in subprocesses

KEY = "probe-key-5f2d"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_weight_root(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, root):
    with builtin_server(tiny_model_dir, tmp_path_factory, root, "--model.trust-remote-code",
                        env={"PRIME_API_KEY": KEY}) as (url, log):
        yield url
    assert KEY not in log.read_text()  # the key is never logged


def test_every_bad_request_is_a_4xx_json_error_and_an_innocent_request_is_unaffected(server, root, tiny_model_dir,
                                                                                     tmp_path):
    outside = shutil.copytree(tiny_model_dir, tmp_path / "step_9")  # a fine weight directory, but not allowed
    probes = request_probes() + weight_probes(root, outside, mismatched_dirs(tiny_model_dir, root / "bad"))
    start = time.monotonic()
    problems = asyncio.run(probe_server(server, probes, KEY))
    assert problems == []
    assert len(probes) > 70 and time.monotonic() - start < 60


def test_edge_values_that_are_valid_are_served_with_finite_logprobs(server):
    """Not every edge is an error: they must be answered correctly, never with NaN."""
    bodies = [{"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e-30, "top_k": 2},
              {"temperature": 1e300}, {"seed": 2**63 - 1, "n": 3}, {"seed": -(2**63)}, {"top_k": 0},
              {"top_k": 10**9}, {"top_p": 1e-300}, {"prompt": "\U0001F600 \\ud800 as text"}]
    for fields in bodies:
        response = httpx.post(f"{server}/v1/completions", json={"prompt": "abc", "max_tokens": 6, **fields},
                              headers=AUTH, timeout=60)
        assert response.status_code == 200, (fields, response.text)
        for choice in response.json()["choices"]:
            assert all(-1e30 < lp <= 0 for lp in choice["logprobs"]["token_logprobs"]), (fields, choice)


def test_an_update_directory_never_runs_code(server, root, tiny_model_dir, tmp_path):
    """A config.json `auto_map` and a .py file next to fitting weights: the tensors load, the code never runs."""
    marker = tmp_path / "code_ran"
    evil = shutil.copytree(tiny_model_dir, root / "evil" / "step_7")
    (evil / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    config = json.loads((evil / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (evil / "config.json").write_text(json.dumps(config))
    response = httpx.post(f"{server}/update_weights", json={"path": str(evil)}, headers=AUTH, timeout=60)
    assert response.status_code == 200 and response.json() == {"weight_step": 7}, response.text
    assert not marker.exists()
    served = httpx.post(f"{server}/v1/completions", json={"prompt": "a", "max_tokens": 3}, headers=AUTH, timeout=60)
    assert served.json()["weight_step"] == 7


def test_a_big_prompt_is_refused_at_once_and_health_is_not_held_up(server):
    """A 2 MB prompt cannot fit the context: it is refused without being tokenized (the character bound), within
    a second, and /health answers promptly meanwhile (parsing and templating run off the event loop)."""
    big = "abcdefgh" * (2 * 2**20 // 8)
    bodies = [("/v1/completions", {"prompt": big, "max_tokens": 2}),
              ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 2})]

    async def go():
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            for path, body in bodies:
                start = time.monotonic()
                task = asyncio.create_task(client.post(path, json=body, headers=AUTH))
                latencies = []
                while not task.done():
                    sent = time.monotonic()
                    assert (await client.get("/health")).status_code == 200
                    latencies.append(time.monotonic() - sent)
                    await asyncio.sleep(0.05)
                response = await task
                yield path, response, time.monotonic() - start, latencies

    async def collect():
        return [item async for item in go()]

    for path, response, took, latencies in asyncio.run(collect()):
        assert response.status_code == 400 and "exceeds the context length" in response.json()["error"]["message"]
        assert "characters, so at least" in response.json()["error"]["message"]  # refused before tokenizing
        assert took < 2.0 and latencies and max(latencies) < 1.0, (path, took, latencies)  # (a loaded machine)


def test_the_orchestrators_client_sends_the_key(server, root, tiny_model_dir):
    from prime_rl.orchestrator.client import InferenceClient, InferenceError
    from prime_rl.orchestrator.config import ClientConfig

    step = shutil.copytree(tiny_model_dir, root / "client" / "step_3")

    async def go(key):
        config = ClientConfig(base_url=f"{server}/v1", api_key=key, connect_timeout_s=5)
        async with InferenceClient(config) as client:
            await client.wait_ready()
            result = await client.chat([{"role": "user", "content": "hi"}], 2, SamplingRule(), 4, seed=1)
            return result, await client.update_weights(str(step), 3)

    result, served = asyncio.run(go(KEY))
    assert len(result.completions) == 2 and served == 3
    for wrong in (None, "not-the-key"):
        with pytest.raises(InferenceError, match="answered 401 .*missing or wrong API key"):
            asyncio.run(go(wrong))
    assert "SecretStr('**********')" in repr(ClientConfig(api_key=KEY)) and KEY not in repr(ClientConfig(api_key=KEY))

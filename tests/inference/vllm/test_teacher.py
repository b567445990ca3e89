"""The teacher's scoring call on the vLLM backend: `prompt_logprobs` equal the model's own log_softmax (fp32, at
temperature 1, the only one vLLM scores at), also for a batch of prompts in one request, and another temperature
is a 400. Skips where vLLM does not import
(docs/inference.md: vllm-cpu in its own venv runs it on a CPU)."""

from __future__ import annotations

import socket

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from prime_rl.models.tiny_model import save_random_model
from prime_rl.orchestrator.client import parse_batch_prompt_logprobs
from tests.support.inference_server import VLLM_CPU_ARGS, VLLM_SKIP_REASON, start_server, stop_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_teacher(tmp_path_factory):
    pytest.importorskip("vllm", reason=VLLM_SKIP_REASON)
    model_dir = save_random_model(tmp_path_factory.mktemp("teacher"), seed=3, hidden_size=128, num_layers=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc, url = start_server(model_dir, tmp_path_factory.mktemp("log") / "teacher.log", "vllm", port, 600,
                             *VLLM_CPU_ARGS)
    yield url, model_dir
    stop_server(proc)


def test_vllm_prompt_logprobs_equal_the_models_log_softmax(vllm_teacher):
    url, model_dir = vllm_teacher
    ids = [1, 40, 41, 57, 33, 2, 70, 12]
    body = {"model": str(model_dir), "prompt": ids, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0,
            "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    served = torch.tensor(parse_batch_prompt_logprobs(answer.json(), [ids])[0], dtype=torch.float64)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].double()
    own = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert torch.allclose(served, own, atol=1e-5, rtol=0), (served - own).abs().max()
    cold = httpx.post(f"{url}/v1/completions", json=body | {"temperature": 0.7}, timeout=120)
    assert cold.status_code == 400 and "temperature 0.7" in cold.text


def test_vllm_scores_a_batch_of_prompts_per_choice(vllm_teacher):
    """The teacher's batched call (`teacher.samples_per_request`): one request, a list of token-id prompts that
    share a prefix, each choice answering its own prompt (vLLM's batch form)."""
    url, model_dir = vllm_teacher
    prompts = [[1, 40, 41, 57, 33, 2], [1, 40, 41, 57, 12, 13, 14, 2], [1, 70]]
    body = {"model": str(model_dir), "prompt": prompts, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0,
            "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    for ids, served in zip(prompts, parse_batch_prompt_logprobs(answer.json(), prompts), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].double()
        own = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert torch.allclose(torch.tensor(served, dtype=torch.float64), own, atol=1e-5, rtol=0)

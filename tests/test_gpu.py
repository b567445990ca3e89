"""The CUDA paths, where a GPU is present (`gpu` marker; skipped elsewhere): the trainer in bf16 mixed
precision on one CUDA rank (NCCL group) and the builtin engine on the GPU.

On a GPU machine the rest of the suite also runs its trainer and engine on CUDA; these tests
check what only a GPU has (the device, bf16, peak memory, MFU), so a CPU-only run cannot hide a break.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from prime_rl.inference.builtin.engine import Engine, SamplingParams
from prime_rl.run_dir import metrics_file, weights_dir
from prime_rl.trainer.config import TrainerConfig
from prime_rl.trainer.perf import peak_flops
from prime_rl.trainer.rl.train import train
from tests.support.synthetic_batches import random_step, write_random_step

pytestmark = pytest.mark.gpu
VOCAB = 99  # the char tokenizer of tiny_model_dir


def test_trainer_steps_in_bf16_on_cuda(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    for step in range(2):
        write_random_step(out, step, 1, random_step(VOCAB, step, 2))
    config = TrainerConfig.build([], {"model": {"name": str(tiny_model_dir)}, "output_dir": str(out), "max_steps": 2,
                                      "seq_len": 64, "wandb": {"mode": "disabled"}, "batch_timeout_s": 30.0})
    assert config.runtime.dtype == "auto"  # bf16 mixed precision on a GPU
    train(config)

    lines = [json.loads(line) for line in metrics_file(out).read_text().splitlines()]
    trainer = [m for m in lines if m["source"] == "trainer"]
    assert [m["step"] for m in trainer] == [0, 1]
    for m in trainer:
        assert m["perf/peak_memory_gib"] > 0
        if peak_flops(torch.device("cuda")) is not None:  # a GPU whose peak FLOP/s the trainer knows
            assert 0 < m["perf/mfu"] < 1
        assert all(math.isfinite(m[k]) for k in ("loss/total", "optim/grad_norm", "loss/importance_ratio"))
    first, second = (load_file(weights_dir(out, step) / "model.safetensors") for step in (1, 2))
    assert all(t.device.type == "cpu" and t.is_floating_point() for t in second.values())
    assert any(not torch.equal(first[k], second[k]) for k in first)


def test_builtin_engine_generates_on_cuda(tiny_model_dir):
    engine = Engine(str(tiny_model_dir), context_len=128, seed=0, device="auto", max_batch_size=4)
    try:
        assert engine.device.type == "cuda"
        prompt = engine.tokenizer("abc", add_special_tokens=False)["input_ids"]
        completions = engine.submit(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=1),
                                    n=3).result(timeout=120)
        assert len(completions) == 3
        for c in completions:
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 8
            assert all(math.isfinite(lp) and lp <= 0 for lp in c.logprobs)
    finally:
        engine.close()


@torch.no_grad()
def test_flash_attention_layout_matches_sdpa_on_shared_prompts(tiny_model_dir):
    """The flash_attention_2 path (branches expanded to full samples, one varlen row) gives the logprobs of
    the sdpa path (per-unit masks, shared roots) on rows holding shared prompts and lone samples."""
    pytest.importorskip("flash_attn")
    from transformers import AutoModelForCausalLM

    from prime_rl.orchestrator.batch import Sample, micro_batch
    from prime_rl.trainer.model import compute_rows_logprobs

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, VOCAB, (9,), generator=g).tolist()
    group = [Sample(prompt, torch.randint(3, VOCAB, (n,), generator=g).tolist(), [-1.0] * n, 1.0, 0) for n in (4, 7, 1)]
    lone = Sample(torch.randint(3, VOCAB, (5,), generator=g).tolist(), [7, 8, 9], [-1.0] * 3, 1.0, 0)
    mb = micro_batch([group, [lone]])
    rows = [(mb.input_ids.cuda(), mb.position_ids.cuda(), mb.sample_lens.cuda())]
    results = {}
    for attn in ("sdpa", "flash_attention_2"):
        net = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16,
                                                   attn_implementation=attn).cuda()
        (lp, _), = compute_rows_logprobs(net, rows)
        results[attn] = lp[mb.loss_mask.cuda()]
    torch.testing.assert_close(results["flash_attention_2"], results["sdpa"], atol=2e-2, rtol=0)  # bf16 kernels


def _nccl_receiver(address: str, queue) -> None:  # pragma: no cover - a GPU child process
    from prime_rl.weight_transfer import open_group, receive

    torch.cuda.set_device(1)
    group = open_group(address, 1, 2, 120, torch.device("cuda", 1))
    step, tensors = receive(group, torch.device("cuda", 1))
    queue.put((step, {name: t.cpu() for name, t in tensors.items()}))


def test_weight_transfer_over_nccl_is_bitwise():
    """The transfer group on NCCL (two GPUs: the trainer's side on cuda:0, a server's on cuda:1)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices (one per side of the transfer group)")
    import multiprocessing as mp
    import socket

    from prime_rl.weight_transfer import open_group, send

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_nccl_receiver, args=(address, queue))
    child.start()
    torch.cuda.set_device(0)
    tensors = {"a": torch.randn(1000, 64, device="cuda"), "b": torch.randn(300, device="cuda").bfloat16()}
    group = open_group(address, 0, 2, 120, torch.device("cuda", 0))
    send(group, 7, tensors, torch.device("cuda", 0), bucket_bytes=100_000)
    step, received = queue.get(timeout=120)
    child.join(timeout=60)
    assert step == 7 and all(torch.equal(received[k], v.cpu()) for k, v in tensors.items())

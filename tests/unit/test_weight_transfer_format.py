"""The weight transfer's wire format (`utils/weight_transfer.py`): buckets cut the same way on both sides from the
header, and a round trip over a gloo group keeps every dtype bit for bit."""

from __future__ import annotations

import socket
import threading

import torch

from prime_rl.utils.weight_transfer import buckets, open_group, receive, send


def test_buckets_are_consecutive_and_bounded_a_bigger_tensor_alone():
    specs = [["a", "float32", [10]], ["b", "float32", [10]], ["c", "bfloat16", [100]], ["d", "float16", [5]]]
    assert buckets(specs, 80) == [[0, 1], [2], [3]]  # 40 + 40 bytes; 200 bytes alone; 10 bytes
    assert buckets(specs, 10_000) == [[0, 1, 2, 3]]
    assert buckets([], 10) == []


def test_a_round_trip_keeps_names_dtypes_shapes_and_bits():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    torch.manual_seed(0)
    sent = {"w": torch.randn(7, 3), "b": torch.randn(11).bfloat16(), "h": torch.randn(2, 2, 2).half(),
            "nan_bits": torch.tensor([float("nan"), -0.0, float("inf")])}
    got = {}

    def server():
        group = open_group(address, 1, 2, 30, torch.device("cpu"))
        got["step"], got["tensors"] = receive(group, torch.device("cpu"), bucket_bytes=64)

    thread = threading.Thread(target=server)
    thread.start()
    group = open_group(address, 0, 2, 30, torch.device("cpu"))
    send(group, 5, sent, torch.device("cpu"), bucket_bytes=64)
    thread.join(timeout=30)
    assert got["step"] == 5 and list(got["tensors"]) == list(sent)
    for name, tensor in sent.items():
        out = got["tensors"][name]
        assert out.dtype == tensor.dtype and out.shape == tensor.shape
        assert torch.equal(out.view(torch.uint8), tensor.view(torch.uint8)), name  # bit for bit, NaN included

"""The weight transfer's wire format (`weight_transfer.py`): buckets cut the same way on both sides from the
header, and a round trip over a gloo group keeps every dtype bit for bit."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from prime_rl.weight_transfer import buckets, open_group, receive, send


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


@pytest.mark.slow  # waits out a timeout
def test_a_server_waits_for_the_next_update_longer_than_the_groups_timeout():
    """A trainer step may take longer than any collective may: servers wait for an update's announcement on the
    store, without the group's timeout (1 s here), and only then join its broadcasts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    got, errors = [], []

    def server():
        try:
            group = open_group(address, 1, 2, 1, torch.device("cpu"))
            for _ in range(2):
                got.append(receive(group, torch.device("cpu")))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=server)
    thread.start()
    group = open_group(address, 0, 2, 1, torch.device("cpu"))
    for step in (1, 2):
        time.sleep(2.5)  # a long trainer step
        send(group, step, {"w": torch.full((3,), float(step))}, torch.device("cpu"))
    thread.join(timeout=30)
    assert not errors, errors
    assert [(step, tensors["w"].tolist()) for step, tensors in got] == [(1, [1.0] * 3), (2, [2.0] * 3)]

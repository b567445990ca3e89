"""Binding the server's port: the one helper the server and `rl`'s pre-check share."""

from __future__ import annotations

import socket

import pytest

from prime_rl.inference.backends import bind
from prime_rl.utils.errors import UserError
from prime_rl.utils.net import listening_socket


def test_port_zero_gives_a_free_port_and_a_busy_port_is_one_line():
    with listening_socket("127.0.0.1", 0) as first:
        port = first.getsockname()[1]
        assert port > 0
        first.listen()
        with pytest.raises(UserError, match=rf"^cannot listen on 127.0.0.1:{port}: Address already in use$"):
            bind("127.0.0.1", port)


def test_a_host_that_is_not_local_is_refused_and_no_socket_leaks(monkeypatch):
    closed = []
    real_close = socket.socket.close
    monkeypatch.setattr(socket.socket, "close", lambda self: (closed.append(True), real_close(self))[1])
    with pytest.raises(OSError):
        listening_socket("192.0.2.1", 0)  # TEST-NET-1: never an address of this machine
    assert closed

"""`listening_socket`: how the inference server binds its port, and how `rl` checks it can."""

from __future__ import annotations

import socket


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` (0: any free port), SO_REUSEADDR set; IPv6 when `host` has a ':'.

    Raises the OSError of the bind (socket.gaierror for a host that does not resolve), the socket closed.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock

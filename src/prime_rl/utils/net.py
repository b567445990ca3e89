"""`listening_socket`: how the inference server binds its port, and how `rl` checks it can; `free_port`;
`server_root`: where a server's own routes live."""

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


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` right now (bound once and released)."""
    with listening_socket(host, 0) as sock:
        return sock.getsockname()[1]


def server_root(base_url: str) -> str:
    """`http://host:port/v1` -> `http://host:port` (where /update_weights and /health live)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root

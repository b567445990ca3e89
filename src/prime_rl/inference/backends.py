"""The inference backends: each one's serve function, registered in `BACKENDS` beside its options section.

`builtin` serves with the embedded torch engine in this process; `vllm` hands this process
over to vLLM's OpenAI server (with prime-rl's routes); `auto` picks vllm when it is
importable and a GPU is present. (Not the entrypoint module itself: `python -m
prime_rl.inference.server` runs that as the main module, and a registry importing it again would
register every backend twice.)
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from prime_rl.inference.config import (
    BACKENDS,
    KEEP_ALIVE_S,
    BuiltinConfig,
    InferenceConfig,
    VLLMConfig,
    resolved_backend,
)
from prime_rl.inference.vllm.launch import exec_vllm
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import setup_logging
from prime_rl.utils.net import listening_socket

if TYPE_CHECKING:  # the engine imports torch and transformers: only a builtin server loads them
    from prime_rl.inference.builtin.engine import Engine


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket here, so port 0 resolves to a known port and a busy port is a clear error."""
    try:
        return listening_socket(host, port)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


@dataclass
class BuiltinServer:
    """A builtin server ready to serve: the HTTP server, its bound socket and the engine behind it."""

    http: uvicorn.Server
    sock: socket.socket
    engine: Engine

    def serve(self) -> None:
        """Serve until `stop()` (or a signal, in the main thread); the engine closes after."""
        try:
            self.http.run(sockets=[self.sock])
        finally:
            self.engine.close()

    def stop(self) -> None:
        self.http.should_exit = True


def builtin_server(config: InferenceConfig) -> BuiltinServer:
    """Bind, load the model and build the app of a builtin server (`serve_builtin` serves it; the test suite
    serves it in a thread)."""
    from prime_rl.inference.builtin.app import create_app
    from prime_rl.inference.builtin.engine import Engine
    from prime_rl.inference.gate import WeightGate
    from prime_rl.openai_api.access import AccessPolicy

    log = setup_logging("inference")
    sock = bind(config.host, config.port)  # before loading: a busy port fails fast
    access = AccessPolicy.from_config(config)
    b = config.builtin
    engine = Engine(config.model.path, context_len=config.seq_len, seed=config.seed, device=b.device, dtype=b.dtype,
                    max_batch_size=b.max_batch_size, trust_remote_code=config.model.trust_remote_code,
                    threads=b.threads, prefix_cache_mib=b.prefix_cache_mib)
    receiver = None
    if config.weight_transfer.mode == "distributed":  # the trainer's broadcasts (inference/transfer.py)
        if config.weight_transfer.ranks_per_server != 1:
            raise UserError(f"weight_transfer.ranks_per_server = {config.weight_transfer.ranks_per_server}, but a "
                            "builtin server is one rank of the transfer group")
        from prime_rl.inference.transfer import TransferReceiver

        receiver = TransferReceiver(config.weight_transfer, engine)
    # Loaded from `model.path` (an embedded default resolves to its directory); served as `model.name`.
    app = create_app(engine, config.model.name, WeightGate(step=0, timeout_s=config.update_timeout_s), access,
                     receiver)
    host, port = sock.getsockname()[:2]
    log.info(f"builtin backend: {config.model.name} on {engine.device}, context {engine.context_len}; "
             f"serving on http://{host}:{port}")
    log.info(f"API key {'required' if access.api_key else 'not set'}; weight updates from: "
             f"{', '.join(map(str, access.weight_roots)) or 'nowhere'}")
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                                         timeout_keep_alive=KEEP_ALIVE_S))
    return BuiltinServer(http, sock, engine)


@BACKENDS.implements(BuiltinConfig)
def serve_builtin(config: InferenceConfig) -> None:
    builtin_server(config).serve()


BACKENDS.implements(VLLMConfig)(exec_vllm)


def serve(config: InferenceConfig) -> None:
    BACKENDS.implementation(resolved_backend(config.backend))(config)

"""The access policy: what the server lets in (the API key, the body cap, the token budget, admin Host names,
the weight roots). Not the policy being trained: that is the served model.

One `AccessPolicy` serves both backends: the builtin server builds it from its config; the vLLM
launcher builds the same one and hands it to the middleware in vLLM's process through
the environment (`to_env` / `from_env`): the key as `VLLM_API_KEY` (which vLLM itself
also checks on `/v1/*`), everything else as JSON in `POLICY_ENV`. Nothing of it is
written to disk.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

POLICY_ENV = "PRIME_INFERENCE_POLICY"
KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable: the key its /v1 routes and our middleware check
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_REQUEST_TOKENS = 2**24  # completion tokens one generate request may ask for (protocol.budget_overflow)


def resolve_roots(dirs: Iterable[str | Path], model_path: str | None) -> tuple[Path, ...]:
    """The allowed weight roots, resolved after symlinks now (at start): `dirs`, plus the served
    model's own directory when it is a local one (reloading it restores the initial weights)."""
    roots = [Path(d) for d in dirs]
    if model_path is not None and Path(model_path).is_dir():
        roots.append(Path(model_path))
    return tuple(dict.fromkeys(Path(os.path.realpath(root)) for root in roots))


@dataclass(frozen=True)
class AccessPolicy:
    api_key: str | None = None
    """Bearer token every endpoint but /health requires; None: no authentication."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body; beyond it: 413."""
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS
    """Most completion tokens one generate request may ask for (prompts x n x max_tokens); beyond it: 400."""
    host: str = "127.0.0.1"
    """The address the server is bound to (a Host name the admin endpoints accept)."""
    allowed_hosts: tuple[str, ...] = ()
    """Further Host names the admin endpoints accept."""
    weight_roots: tuple[Path, ...] = ()
    """Resolved directories /update_weights may load from (or below)."""
    model_dir: str | None = None
    """The served model's directory (the reference an update is compared with by the vLLM middleware)."""

    @classmethod
    def from_config(cls, config) -> AccessPolicy:
        """The access policy of an `InferenceConfig`."""
        key = config.api_key.get_secret_value() if config.api_key is not None else None
        return cls(api_key=key or None, max_request_bytes=config.max_request_bytes,
                   max_request_tokens=config.max_request_tokens, host=config.host,
                   allowed_hosts=tuple(config.allowed_hosts),
                   weight_roots=resolve_roots(config.weight_dirs, config.model.path), model_dir=config.model.path)

    def to_env(self) -> dict[str, str]:
        public = {"max_request_bytes": self.max_request_bytes, "max_request_tokens": self.max_request_tokens,
                  "host": self.host,
                  "allowed_hosts": list(self.allowed_hosts), "weight_roots": [str(r) for r in self.weight_roots],
                  "model_dir": self.model_dir}
        env = {POLICY_ENV: json.dumps(public)}
        if self.api_key:
            env[KEY_ENV] = self.api_key
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AccessPolicy:
        """The access policy `to_env` wrote; without it (vLLM started by hand) the defaults: no key
        unless VLLM_API_KEY is set, and no weight directory allowed."""
        public = json.loads(environ.get(POLICY_ENV, "{}"))
        return cls(api_key=environ.get(KEY_ENV) or None,
                   max_request_bytes=int(public.get("max_request_bytes", DEFAULT_MAX_REQUEST_BYTES)),
                   max_request_tokens=int(public.get("max_request_tokens", DEFAULT_MAX_REQUEST_TOKENS)),
                   host=public.get("host", "127.0.0.1"), allowed_hosts=tuple(public.get("allowed_hosts", ())),
                   weight_roots=tuple(Path(r) for r in public.get("weight_roots", ())),
                   model_dir=public.get("model_dir"))

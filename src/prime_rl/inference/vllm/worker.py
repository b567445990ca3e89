"""vLLM worker extension: load weights from a directory, or from the trainer's torch.distributed transfer, into
the running model.

vLLM mixes this class into each of its workers (`--worker-extension-cls`); the API server reaches it through
`engine_client.collective_rpc(method, args=...)`, which runs the method on every worker (each tensor-parallel
rank loads its own shard from the full tensors) and returns their results in rank order.

Weights from a directory: `load_weights_from_dir(path)`.

Weights over the transfer group (`weight_transfer.mode = "distributed"`, `utils/weight_transfer.py`): every
worker is a rank of the trainer's group, `weight_transfer.rank` + its tensor-parallel rank, and receives every
update in full in a thread (`transfer.TransferReceiver`), checked against the served checkpoint
(`weight_check.verify_tensors`) and kept on the host. An update is then two calls from the middleware:
`pin_transferred_weights(step, timeout_s)` sets aside the newest received update of step >= `step` and returns
its step (outside the weight gate: it may wait for the broadcast); `load_pinned_weights(step)` loads it (inside
the gate, once in-flight requests are done).

vLLM >= 0.3x has `Worker.reload_weights`, an in-place reload that also redoes the post-load processing (on CPU,
linear weights are repacked for oneDNN and the original parameter is dropped, so writing into the parameters
alone would not work). Older vLLM without it gets the model's own `load_weights`, which knows the fused/sharded
layout.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.inference.weight_check import Reference, iter_tensors, verify_tensors
from prime_rl.utils.logging import ensure_logging

WORKER_EXTENSION = f"{__name__}.WeightDirWorkerExtension"
LOAD_DIR = "load_weights_from_dir"
START_TRANSFER = "start_weight_transfer"
PIN_TRANSFERRED = "pin_transferred_weights"
LOAD_PINNED = "load_pinned_weights"


class TransferStage:
    """What a vLLM worker does with a received update (`TransferReceiver`'s `engine`): check it against the
    served checkpoint (None: values only) and keep it on the host as it came; vLLM's loader casts and shards."""

    def __init__(self, device: torch.device, reference: Reference | None):
        self.device = device
        self.reference = reference

    def stage_tensors(self, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
        verify_tensors(source, tensors, self.reference)
        return tensors


class WeightDirWorkerExtension:
    """Methods added to vLLM's worker (`self` is the worker)."""

    def load_weights_from_dir(self, path: str) -> None:
        """Replace the served weights by the HF-format checkpoint in `path` (the middleware checked it:
        `weight_check`); only its safetensors are read."""
        self._prime_reload(iter_tensors(path))

    def start_weight_transfer(self, config_json: str, model_dir: str | None) -> int:
        """Join the trainer's transfer group in a thread, as rank `rank` + this worker's rank (`config_json`: the
        server's `WeightTransferConfig`); updates are checked against the checkpoint in `model_dir`. Returns the
        rank."""
        config = WeightTransferConfig.model_validate_json(config_json)
        worker_rank = int(getattr(self, "rank", 0))
        if worker_rank >= config.ranks_per_server:
            raise ValueError(f"vLLM worker {worker_rank} has no rank in the weight transfer group "
                             f"(weight_transfer.ranks_per_server = {config.ranks_per_server})")
        from prime_rl.inference.transfer import TransferReceiver

        ensure_logging("inference")  # a vLLM worker process: the receiver's lines go to the server's log
        reference = Reference.from_dir(model_dir) if model_dir is not None and Path(model_dir).is_dir() else None
        device = torch.device(getattr(self, "device", None) or "cpu")
        rank = config.rank + worker_rank
        self.prime_transfer = TransferReceiver(config.model_copy(update={"rank": rank}),
                                               TransferStage(device, reference))
        self.prime_pinned: tuple[int, dict[str, torch.Tensor]] | None = None
        return rank

    def pin_transferred_weights(self, step: int, timeout_s: float) -> int:
        """Set aside the newest received update of step >= `step` (waiting at most `timeout_s`); its step."""
        receiver = getattr(self, "prime_transfer", None)
        if receiver is None:
            raise RuntimeError("this vLLM worker is in no weight transfer group")
        self.prime_pinned = receiver.take(step, timeout_s)
        return self.prime_pinned[0]

    def load_pinned_weights(self, step: int) -> None:
        """Load the update `pin_transferred_weights` set aside, which must be of `step`."""
        pinned = getattr(self, "prime_pinned", None)
        if pinned is None or pinned[0] != step:
            raise RuntimeError(f"no transferred weights of step {step} are set aside on this worker "
                               f"({'none' if pinned is None else f'step {pinned[0]}'} are)")
        self.prime_pinned = None
        self._prime_reload(iter(pinned[1].items()))

    def _prime_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        if hasattr(self, "reload_weights"):
            self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
            retie_lm_head(self.model_runner.get_model())
        else:
            self.model_runner.model.load_weights(weights=weights)


def retie_lm_head(model) -> None:
    """Point a tied LM head at the reloaded embedding again.

    With tied embeddings the checkpoint has no `lm_head.weight`; vLLM's in-place reload
    then keeps the head's old tensors (logging "ParallelLMHead: Failed to load weights")
    while the embedding gets the new ones. Re-tie, and redo the head's post-load step
    (on CPU it builds a GEMM handle from the weight).
    """
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return
    if lm_head.weight is not embed.weight:
        lm_head.tie_weights(embed)
    method = getattr(lm_head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(lm_head)

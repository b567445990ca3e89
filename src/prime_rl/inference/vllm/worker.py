"""vLLM worker extension: load weights from a directory, or from the trainer's torch.distributed transfer, into
the running model.

vLLM mixes this class into each of its workers (`--worker-extension-cls`); the API server reaches it through
`engine_client.collective_rpc(method, args=...)`, which runs the method on every worker (each tensor-parallel
rank loads its own shard from the full tensors) and returns their results in rank order.

Weights from a directory: `load_weights_from_dir(path, pins)`: the middleware checked the directory's files on
descriptors it holds open, and `pins` names each tensor file by its real path, device and inode
(`weights.WeightDir.pins`); the worker opens them again and refuses, before it loads anything, any that is not the
very file checked (a rename in between cannot redirect the read). A worker on another host (its device numbers
differ) cannot load from a directory.

Weights over the transfer group (`weight_transfer.mode = "distributed"`, `weight_transfer.py`): every
worker is a rank of the trainer's group, `weight_transfer.rank` + its tensor-parallel rank, and receives every
update in full in a thread (`transfer.TransferReceiver`), cast to the served dtype, checked against the served
checkpoint (`weight_check.verify_tensors`) and kept on the host. An update is then three calls from the
middleware, none of which waits: `transferred_step()` (polled until every worker has the step),
`pin_transferred_weights(step)` sets aside the newest received update of step >= `step` and returns its step
(outside the weight gate), `load_pinned_weights(step)` loads it (inside the gate, once in-flight requests are
done) and drops the host copy.

The transfer methods never raise: they answer `["ok", value]` or `["error", one line]`. With several workers
vLLM stops reading the answers at the first worker that raises, and the next call would read the others'
stale answers; the middleware raises once it has every worker's (`transfer_result`).

vLLM >= 0.3x has `Worker.reload_weights`, an in-place reload that also redoes the post-load processing (on CPU,
linear weights are repacked for oneDNN and the original parameter is dropped, so writing into the parameters
alone would not work). Older vLLM without it gets the model's own `load_weights`, which knows the fused/sharded
layout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch

from prime_rl.configs.shared import WeightTransferConfig
from prime_rl.inference.weight_check import Reference, iter_tensors, verify_tensors
from prime_rl.inference.weight_dirs import open_pinned
from prime_rl.utils.errors import UserError, first_line
from prime_rl.utils.logging import ensure_logging

WORKER_EXTENSION = f"{__name__}.WeightDirWorkerExtension"
LOAD_DIR = "load_weights_from_dir"
START_TRANSFER = "start_weight_transfer"
TRANSFERRED_STEP = "transferred_step"
PIN_TRANSFERRED = "pin_transferred_weights"
LOAD_PINNED = "load_pinned_weights"


class TransferStage:
    """What a vLLM worker does with a received update (`TransferReceiver`'s `engine`): cast its floating tensors
    to the served dtype (None: keep them; one host copy in that dtype), check them against the served checkpoint
    (None: values only; a value that overflows the served dtype is not finite), keep them on the host. vLLM's
    loader shards them."""

    def __init__(self, device: torch.device, reference: Reference | None, dtype: torch.dtype | None):
        self.device, self.reference, self.dtype = device, reference, dtype

    def stage_tensors(self, tensors: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
        if self.dtype is not None:
            tensors = {name: t.to(self.dtype) if t.is_floating_point() else t for name, t in tensors.items()}
        verify_tensors(source, tensors, self.reference)
        return tensors


def reported(method):
    """A transfer method that answers ["ok", its value] or ["error", the exception in one line], never raising."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return ["ok", method(*args, **kwargs)]
        except Exception as exc:  # noqa: BLE001 - every failure goes back as an answer
            return ["error", first_line(exc)]

    return wrapper


def transfer_result(answers: list) -> list:
    """The workers' values of a `reported` method, or RuntimeError naming the first worker that failed."""
    for rank, answer in enumerate(answers):
        if not (isinstance(answer, list | tuple) and len(answer) == 2 and answer[0] in ("ok", "error")):
            raise RuntimeError(f"vLLM worker {rank} answered {answer!r:.100}, not a prime-rl transfer answer")
        if answer[0] == "error":
            raise RuntimeError(f"vLLM worker {rank}: {(str(answer[1]).strip().splitlines() or [''])[0]}")
    return [answer[1] for answer in answers]


class WeightDirWorkerExtension:
    """Methods added to vLLM's worker (`self` is the worker)."""

    def load_weights_from_dir(self, path: str, pins: list) -> None:
        """Replace the served weights by the HF-format checkpoint in `path` (the middleware checked it:
        `weight_check`); only its safetensors are read, each the very file the middleware checked (`pins`,
        `weights.open_pinned`: all opened and compared before any tensor loads)."""
        with open_pinned(path, pins) as weights:
            self._prime_reload(iter_tensors(weights))

    @reported
    def start_weight_transfer(self, config_json: str, model_dir: str | None) -> int:
        """Join the trainer's transfer group in a thread, as rank `rank` + this worker's rank (`config_json`: the
        server's `WeightTransferConfig`); updates are checked against the checkpoint in `model_dir`. Returns the
        rank (a second call: the rank it joined as)."""
        log = ensure_logging("inference")  # a vLLM worker process: the receiver's lines go to the server's log
        config = WeightTransferConfig.model_validate_json(config_json)
        worker_rank = self.rank  # vLLM's rank of this worker (tensor parallel)
        if worker_rank >= config.ranks_per_server:
            raise ValueError(f"vLLM worker {worker_rank} has no rank in the weight transfer group "
                             f"(weight_transfer.ranks_per_server = {config.ranks_per_server})")
        rank = config.rank + worker_rank
        if getattr(self, "prime_transfer", None) is not None:
            return self.prime_transfer.config.rank
        from prime_rl.inference.transfer import TransferReceiver

        reference = None
        try:
            reference = Reference.from_dir(model_dir) if model_dir is not None else None
        except UserError as exc:
            log.warning(f"cannot read the served model's checkpoint ({exc})")
        if reference is None:
            log.warning("transferred weights are checked for finite values only: the served checkpoint "
                        f"({model_dir}) cannot be read")
        model_config = getattr(self, "model_config", None)
        dtype = getattr(model_config, "dtype", None)
        stage = TransferStage(torch.device(self.device), reference, dtype if isinstance(dtype, torch.dtype) else None)
        self.prime_loaded, self.prime_pinned = -1, None
        self.prime_transfer = TransferReceiver(config.model_copy(update={"rank": rank}), stage)
        return rank

    @reported
    def transferred_step(self) -> int:
        """The newest received (and checked) update's step, -1 if none; an error once the receiver stopped
        before any update of a later step could come."""
        step, error = self._prime_receiver().newest()
        if error is not None and step <= getattr(self, "prime_loaded", -1):
            raise RuntimeError(f"the weight transfer stopped ({error})")
        return step

    @reported
    def pin_transferred_weights(self, step: int) -> int:
        """Set aside the newest received update, which must be of step >= `step`; its step."""
        newest, tensors = self._prime_receiver().take(step, 0.0)
        if tensors is None and newest != self.prime_loaded:
            raise RuntimeError(f"the transferred weights of step {newest} were released unloaded")
        self.prime_pinned = (newest, tensors)  # tensors None: that step is the one loaded
        return newest

    @reported
    def load_pinned_weights(self, step: int) -> None:
        """Load the update `pin_transferred_weights` set aside, which must be of `step`, and drop its host copy."""
        pinned = getattr(self, "prime_pinned", None)
        if pinned is None or pinned[0] != step:
            raise RuntimeError(f"no transferred weights of step {step} are set aside on this worker "
                               f"({'none' if pinned is None else f'step {pinned[0]}'} are)")
        self.prime_pinned = None
        if pinned[1] is not None:
            self._prime_reload(iter(pinned[1].items()))
        self.prime_loaded = step
        self.prime_transfer.release(step)

    def _prime_receiver(self):
        receiver = getattr(self, "prime_transfer", None)
        if receiver is None:
            raise RuntimeError("this vLLM worker is in no weight transfer group")
        return receiver

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

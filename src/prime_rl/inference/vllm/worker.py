"""vLLM worker extension: load weights from a directory into the running model.

vLLM mixes this class into each of its workers (`--worker-extension-cls`); the API
server reaches it through `engine_client.collective_rpc("load_weights_from_dir", ...)`,
which runs the method on every worker (each tensor-parallel rank loads its own shard).

vLLM >= 0.3x has `Worker.reload_weights`, an in-place reload that also redoes the
post-load processing (on CPU, linear weights are repacked for oneDNN and the original
parameter is dropped, so writing into the parameters alone would not work). Older vLLM
without it gets the model's own `load_weights`, which knows the fused/sharded layout.
"""

from __future__ import annotations

from prime_rl.inference.weight_check import iter_tensors

WORKER_EXTENSION = f"{__name__}.WeightDirWorkerExtension"


class WeightDirWorkerExtension:
    """Methods added to vLLM's worker (`self` is the worker)."""

    def load_weights_from_dir(self, path: str) -> None:
        """Replace the served weights by the HF-format checkpoint in `path` (the middleware checked it:
        `weight_check`); only its safetensors are read."""
        weights = iter_tensors(path)
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

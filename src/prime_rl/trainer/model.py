"""The trainer's model: load (or randomly initialise) a Hugging Face causal LM, shard it
with FSDP2, and compute per-token logprobs and entropies of packed rows (and the final hidden
states a value head reads, from the same forward).

Packing: a row holds several samples (and shared prompts) end to end; `attention_layout`
turns rows into one forward whose attention never crosses a unit (position ids alone do
not isolate samples on CPU: docs/architecture.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from prime_rl.configs.shared import ModelConfig
from prime_rl.models.output_head import head_output_is_logits, output_embedding_as
from prime_rl.models.sampling_rule import SamplingRule, kept_mask
from prime_rl.trainer.attention_layout import ForwardLayout, Row, flash_layout, padded_layout
from prime_rl.trainer.chunked_logprobs import token_stats_head
from prime_rl.trainer.config import ModelInitConfig, RuntimeConfig
from prime_rl.utils.errors import UserError


def resolve_dtype(options: RuntimeConfig, device: torch.device) -> torch.dtype:
    if options.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, options.dtype)


def load_tokenizer(model: ModelConfig, init: ModelInitConfig | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of `model.path`, or of the random-init section (`'char'` = built-in)."""
    source = init.tokenizer if init is not None else model.path
    if source == "char":
        from prime_rl.models.char_tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load tokenizer {source!r}: {exc}") from None


def _init_config(
    init: ModelInitConfig, tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool
) -> PretrainedConfig:
    if init.config is None:
        from prime_rl.models.tiny_model import tiny_qwen3_config

        config = tiny_qwen3_config(tokenizer)
    else:
        path = Path(init.config)
        if path.is_file():
            data = json.loads(path.read_text())
            config = AutoConfig.for_model(data.pop("model_type"), **data)
        else:
            try:
                config = AutoConfig.from_pretrained(init.config, trust_remote_code=trust_remote_code)
            except (OSError, ValueError) as exc:
                raise UserError(f"cannot load model config {init.config!r}: {exc}") from None
    if init.overrides:
        # Rebuilt from a dict (not setattr) so derived fields follow, e.g. Qwen3's per-layer `layer_types`.
        data = config.to_dict()
        if "num_hidden_layers" in init.overrides and "layer_types" not in init.overrides:
            data.pop("layer_types", None)
        data.update(init.overrides)
        try:
            config = type(config).from_dict(data)
        except (TypeError, ValueError) as exc:
            raise UserError(f"init.overrides do not make a valid {type(config).__name__}: {exc}") from None
    if config.vocab_size < len(tokenizer):
        raise UserError(f"model vocab_size {config.vocab_size} is smaller than the tokenizer ({len(tokenizer)} tokens)")
    return config


def load_model(
    model: ModelConfig,
    options: RuntimeConfig,
    device: torch.device,
    init: ModelInitConfig | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
) -> nn.Module:
    """Load `model.path` (or build `init`'s architecture with random weights, seeded) on `device`.

    Parameters are kept in `options.dtype` (float32 on CPU); on GPU FSDP's mixed precision
    policy then computes in bfloat16 while the optimizer updates float32 master weights.
    """
    if init is not None:
        config = _init_config(init, tokenizer or load_tokenizer(model, init), model.trust_remote_code)
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_config(config, trust_remote_code=model.trust_remote_code,
                                               **_load_kwargs(options, device))
        net.config.use_cache = False
        return net.to(device)
    return load_pretrained(AutoModelForCausalLM, model.path, model, options, device)


def _load_kwargs(options: RuntimeConfig, device: torch.device) -> dict:
    param_dtype = torch.float32 if device.type == "cuda" else resolve_dtype(options, device)
    return dict(dtype=param_dtype, attn_implementation=options.attn_implementation)


def load_pretrained(auto_class, path: str, model: ModelConfig, options: RuntimeConfig, device: torch.device,
                    **kwargs) -> nn.Module:
    """`auto_class.from_pretrained(path, **kwargs)` under `load_model`'s dtype and attention rules, on `device`."""
    try:
        net = auto_class.from_pretrained(path, trust_remote_code=model.trust_remote_code,
                                         **_load_kwargs(options, device), **kwargs)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load model {path!r}: {exc}") from None
    net.config.use_cache = False
    # Moved after loading: `device_map` / a device context would need the `accelerate` package.
    return net.to(device)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (HF causal LMs keep them in `model.model.layers`)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise UserError(f"{type(model).__name__} has no model.layers; the trainer supports HF decoder-only LMs")
    return list(layers)


def prepare_model(model: nn.Module, options: RuntimeConfig, device: torch.device, trainable: bool = True) -> nn.Module:
    """Activation checkpointing, torch.compile, then FSDP2: `fully_shard` per decoder layer and at the root."""
    layers = decoder_layers(model)
    if trainable and options.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, layer in enumerate(layers):
            model.model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
        layers = list(model.model.layers)
    if options.compile:
        for layer in layers:
            layer.compile()
    mp = None
    if device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=resolve_dtype(options, device), reduce_dtype=torch.float32)
    kwargs = {"mp_policy": mp} if mp is not None else {}
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    return model


def forward_rows(model: nn.Module, rows: list[Row], pad_id: int = 0,
                 hidden: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Logits [T_i, V] (float32) of several packed rows `(input_ids, position_ids, sample_lens)` in one forward
    (`attention_layout`: per-unit attention, shared prompts computed once with sdpa/eager), and with `hidden`
    the final hidden states [T_i, H] (float32) of that same forward, else None.

    The final hidden state h_t is the input of the output embedding (`get_output_embeddings()`, lm_head:
    logits_t = lm_head(h_t)), captured by a forward pre-hook; Hugging Face's causal LMs apply
    `logits_to_keep` to h before lm_head, so h and the logits come at the same positions and are mapped
    to row order alike (`layout.index`)."""
    layout = _layout(model, rows, pad_id)
    out, captured = _forward_layout(model, layout, hidden)
    return _in_row_order(out, layout), (_in_row_order(captured, layout) if hidden else None)


def forward_hidden(model: nn.Module, rows: list[Row], pad_id: int = 0) -> list[torch.Tensor]:
    """The final hidden states [T_i, H] (float32) of `forward_rows`, without computing logits where the model
    allows (`models.output_head.head_output_is_logits`: the head answers a [.., 1] placeholder instead)."""
    if not head_output_is_logits(model):
        return forward_rows(model, rows, pad_id, hidden=True)[1]
    layout = _layout(model, rows, pad_id)
    with output_embedding_as(model, lambda h: h.new_zeros(*h.shape[:-1], 1)):
        _, captured = _forward_layout(model, layout, hidden=True)
    return _in_row_order(captured, layout)


def _layout(model: nn.Module, rows: list[Row], pad_id: int) -> ForwardLayout:
    attn = getattr(model.config, "_attn_implementation", None)
    return flash_layout(rows) if attn == "flash_attention_2" else padded_layout(rows, pad_id)


def _forward_layout(model: nn.Module, layout: ForwardLayout, hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the model's output per layout position, the output embedding's input there with `hidden`)."""
    mask = layout.attention_mask
    if mask is not None and getattr(model.config, "_attn_implementation", None) == "eager":
        # eager attention adds the mask to the scores: a bool mask would add 1, not -inf
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    keep = {} if layout.keep is None else {"logits_to_keep": layout.keep}
    captured: list[torch.Tensor] = []
    hook = None
    if hidden:
        head = model.get_output_embeddings()
        if head is None:
            raise UserError(f"{type(model).__name__} has no output embedding (lm_head) to take hidden states from")
        hook = head.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    try:
        out = model(input_ids=layout.input_ids, position_ids=layout.position_ids, attention_mask=mask,
                    use_cache=False, **keep)
    finally:
        if hook is not None:
            hook.remove()
    return out.logits, (captured[-1] if hidden else None)


def _in_row_order(per_position: torch.Tensor, layout: ForwardLayout) -> list[torch.Tensor]:
    """[B, W, D] outputs of a layout's forward (or [1, len(keep), D] with `keep`) as float32 [T_i, D] per row."""
    if layout.keep is not None and per_position.shape[1] != layout.keep.numel():
        per_position = per_position[:, layout.keep]  # a head that ignores logits_to_keep (the critic's)
    flat = per_position.flatten(0, 1)
    return [flat[index].float() for index in layout.index]


def forward_rows_logits(model: nn.Module, rows: list[Row], pad_id: int = 0) -> list[torch.Tensor]:
    """The logits of `forward_rows`."""
    return forward_rows(model, rows, pad_id)[0]


def from_previous_position(x: torch.Tensor, sample_lens: torch.Tensor) -> torch.Tensor:
    """y [T]: y[t] = x[t - 1], and 0 at every segment's first token (nothing of its segment precedes it). What
    position t - 1 computes is the state token t was sampled from: a value V_t is read there."""
    shifted = torch.cat([x.new_zeros(1), x[:-1]])
    return shifted.masked_fill(segment_starts(sample_lens.to(x.device), int(x.numel())), 0.0)


def segment_starts(sample_lens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Bool [T]: true at the first token of every segment."""
    starts = torch.zeros(num_tokens, dtype=torch.bool, device=sample_lens.device)
    starts[(torch.cumsum(sample_lens, 0) - sample_lens)[sample_lens > 0]] = True
    return starts


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, sample_lens: torch.Tensor,
                   rule: SamplingRule = SamplingRule(), entropies: bool = True
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs and entropies of a packed row from its logits [T, V] (in row order), under the
    distribution the sampler drew token t from (`rule`: temperature T and truncation, `models.sampling_rule`).

    Without truncation: lp[t] = log_softmax(logits[t-1] / T)[input_ids[t]].
    With truncation (top_k, top_p or min_p): the same rule is applied to these logits, giving the kept set
    K_t, and the sampled token a = input_ids[t] is added to it, then

        lp[t] = s_a - logsumexp_{v in K_t ∪ {a}} s_v,      s = logits[t-1] / T

    On-policy K_t is the server's kept set (same logits, same rule), so lp equals the server's logprob
    and the importance ratio is 1. Off-policy K_t is the current policy's own kept set: the ratio is
    that of the policy as it would sample now; a token it would no longer keep gets the smallest finite
    logprob the rule allows (joining K_t) instead of log 0 = -inf, which would make every loss NaN.
    The set is not differentiated through (a step function); the renormalisation is.

    Ids from `rule.vocab` on (the padded rows past the tokenizer) are never sampled: their logits are left out.

    H[t] = -sum_v q_v log q_v of that same distribution q (the truncated one when truncating). Both lp
    and H are 0 where nothing predicts token t: every segment's first token, whose logits row belongs to
    the previous segment. With `entropies=False` the entropy (a second pass over the vocabulary) is
    skipped and None.
    """
    scaled = (logits[:-1] if rule.vocab is None else logits[:-1, :rule.vocab]) / rule.temperature
    targets = input_ids[1:, None]
    kept = None
    if rule.truncates:
        kept = kept_mask(scaled, rule).scatter_(-1, targets, True)
        scaled = scaled.masked_fill(~kept, float("-inf"))
    logp = torch.log_softmax(scaled, dim=-1)
    lp = logp.gather(-1, targets).squeeze(-1)
    starts = segment_starts(sample_lens.to(logits.device), int(input_ids.numel()))
    lp = torch.cat([logits.new_zeros(1), lp]).masked_fill(starts, 0.0)
    if not entropies:
        return lp, None
    finite = logp if kept is None else logp.masked_fill(~kept, 0.0)  # 0 * -inf would be NaN (and its gradient)
    ent = torch.cat([logits.new_zeros(1), -(logp.exp() * finite).sum(-1)])
    return lp, ent.masked_fill(starts, 0.0)


def compute_logprobs(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     sample_lens: torch.Tensor, rule: SamplingRule = SamplingRule(), wanted: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs [T], entropies [T]) of a packed row under `model`, scored as the sampler's `rule` drew them.

    See `token_logprobs` for the math. `wanted`: bool [T], the tokens whose (lp, H) is read (`MicroBatch.
    scored_tokens`); the others are 0 and cost the output head nothing. Tensors may live on any device; results
    are float32 on the model's device. Gradients flow unless called under `torch.no_grad()`.
    """
    return score_rows(model, [(input_ids, position_ids, sample_lens)], rule,
                      wanted=None if wanted is None else [wanted])[0][0]


def compute_rows_logprobs(model: nn.Module, rows: list[Row], rule: SamplingRule = SamplingRule(), pad_id: int = 0,
                          entropies: bool = True) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """`compute_logprobs` of several packed rows `(input_ids, position_ids, sample_lens)` in one forward."""
    return score_rows(model, rows, rule, pad_id, entropies)[0]


def compute_logprobs_and_hidden(model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                                sample_lens: torch.Tensor, rule: SamplingRule = SamplingRule()
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`compute_logprobs` of a packed row and its final hidden states [T, H] (float32) from the same forward
    (`forward_rows`: the input of lm_head, position t in row order)."""
    ((lp, ent),), (hidden,) = score_rows(model, [(input_ids, position_ids, sample_lens)], rule, hidden=True)
    return lp, ent, hidden


def score_rows(model: nn.Module, rows: list[Row], rule: SamplingRule = SamplingRule(), pad_id: int = 0,
               entropies: bool = True, hidden: bool = False, wanted: list[torch.Tensor] | None = None
               ) -> tuple[list[tuple[torch.Tensor, torch.Tensor | None]], list[torch.Tensor] | None]:
    """((lp, H) per row as `token_logprobs` defines them, final hidden states per row with `hidden`) of packed
    rows in one forward. Where the model allows (`models.output_head.head_output_is_logits`) the output embedding
    answers (lp, H) per position in chunks of tokens and no [tokens, vocab] logits exist (`trainer.chunked_logprobs`),
    and only at the positions that predict a token of their own segment (not padding, nor a segment's last token)
    that is `wanted` (bool [T_i] per row; default all); else the full logits are scored. Either way (lp, H) is 0 at
    a token not wanted."""
    rows = on_model_device(model, rows)
    _check_sampled_vocabulary(rows, rule)
    wanted = [None] * len(rows) if wanted is None else [w.to(rows[0][0].device) for w in wanted]
    if not head_output_is_logits(model):
        logits, hiddens = forward_rows(model, rows, pad_id, hidden)
        scored = [_only(token_logprobs(lg, ids, lens, rule, entropies), want)
                  for lg, (ids, _, lens), want in zip(logits, rows, wanted, strict=True)]
        return scored, hiddens
    layout = _layout(model, rows, pad_id)
    targets = torch.zeros(_num_outputs(layout), dtype=torch.long, device=layout.input_ids.device)
    positions = []  # of the layout, those whose prediction is read
    for (ids, _, lens), index, want in zip(rows, layout.index, wanted, strict=True):
        targets[index[:-1]] = ids[1:]  # position t predicts token t + 1 of its row (masked at segment starts)
        read = ~segment_starts(lens, int(ids.numel()))[1:]
        positions.append(index[:-1][read if want is None else read & want[1:]])
    with token_stats_head(model, targets, rule, entropies, torch.cat(positions)):
        out, captured = _forward_layout(model, layout, hidden)
    scored = []
    for stats, (ids, _, lens) in zip(_in_row_order(out, layout), rows, strict=True):
        starts = segment_starts(lens, int(ids.numel()))
        lp, ent = (torch.cat([stats.new_zeros(1), stats[:-1, k]]).masked_fill(starts, 0.0) for k in (0, 1))
        scored.append((lp, ent if entropies else None))
    return scored, (_in_row_order(captured, layout) if hidden else None)


def _only(stats: tuple[torch.Tensor, torch.Tensor | None], wanted: torch.Tensor | None
          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(lp, H) with 0 at the tokens not `wanted`."""
    if wanted is None:
        return stats
    return tuple(None if x is None else x.masked_fill(~wanted, 0.0) for x in stats)


def _num_outputs(layout: ForwardLayout) -> int:
    """How many positions the forward answers for: B * W, or len(keep)."""
    return layout.input_ids.numel() if layout.keep is None else layout.keep.numel()


def _check_sampled_vocabulary(rows: list[Row], rule: SamplingRule) -> None:
    """Every token must be one the sampler could draw (`rule.vocab`): a padded row's id has no logprob."""
    if rule.vocab is None:
        return
    top = max(int(ids.max()) for ids, _, _ in rows if ids.numel())
    if top >= rule.vocab:
        raise UserError(f"token id {top} is past the sampled vocabulary ({rule.vocab} ids, the tokenizer's): "
                        "the batch holds an id no server may sample")


def on_model_device(model: nn.Module, rows: list[Row]) -> list[Row]:
    """`rows` on the device of `model`'s parameters."""
    device = next(model.parameters()).device
    return [(ids.to(device), pos.to(device), lens.to(device)) for ids, pos, lens in rows]

"""The builtin engine: torch + transformers with a KV cache and continuous batching.

One background thread owns the model. Every loop iteration it

1. admits waiting requests (up to `max_batch_size` sequences in all; `scheduler.py`, fair between
   callers): their prompts are prefilled together (left-padded), each admitted
   request's prompt once however many of its choices (`n`) start; that row's cache is copied to
   each of its sequences, and each sequence samples its first token from the row's logits with
   its own generator (choice i of a request seeded s samples what a lone request seeded s + i
   does); requests with the same prompt (a group's agent sessions) share one row, and a prompt
   that continues a finished sequence (a conversation's next turn) is prefilled only past the
   longest stored prefix (`kv_cache.PrefixStore`, `inference.builtin.prefix_cache_mib`); a
   request with `prompt_logprobs` also gets every prompt token's logprob from the same
   prefill's logits (`_score_prompt`: the teacher's scoring call, docs/inference.md);
2. merges the new sequences' KV cache into the running batch (`kv_cache.BatchCache`, which owns
   the cache, its padding and its positions, so a row computes what it would compute alone);
3. runs one decode step for every running sequence and drops the finished ones.

So a request that arrives while others decode joins at the very next decode step; it
never waits for the running batch to finish (only for a free slot when the batch is
full).

A request that fails on its own (its generator cannot be made, its sampling raises or
gives a non-finite logprob) fails alone; its rows leave the batch and the others go on.
Only a failing model forward fails the whole batch.

Weight updates are read and checked off the engine thread (`stage_weights`, see
`weight_check`; a LoRA adapter directory: `adapter_check`, merged into a copy of the base
weights by `merge.py`), then copied into the running model in place (`apply_weights`) between
two loop iterations, never during a forward; the model object and its architecture never
change. `weight_step` is the step of the weights in the model, and every sampled token
records it (`Completion.weight_steps`): sequences running across an update go on under
the new weights with the cache computed under the old ones (as PipelineRL does), so a
choice's steps never decrease. Whether requests may run across an update is the
caller's choice (`gate.py`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from prime_rl.inference.adapter_check import verify_adapter_dir
from prime_rl.inference.builtin.kv_cache import (
    BatchCache,
    PrefixStore,
    left_padded,
    position_ids,
    row_caches,
    shared_prefixes,
    stacked_cache,
    take_rows,
)
from prime_rl.inference.builtin.merge import BaseWeights, Staged
from prime_rl.inference.builtin.scheduler import Request, SamplingParams, Scheduler, Seq, fail_rows
from prime_rl.inference.sampling import processed_logprobs, sample_rows
from prime_rl.inference.weight_check import Reference, verify_tensors, verify_weight_dir
from prime_rl.inference.weight_dirs import WeightDir, opened
from prime_rl.models import attention
from prime_rl.models.lora_adapter import lora_delta
from prime_rl.models.output_head import head_output_is_logits, output_embedding_as
from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.models.vocabulary import tokenizer_vocab
from prime_rl.openai_api.protocol import Completion, context_overflow
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger

# What the server, the tests and the benchmarks import from here (some defined in `scheduler.py` and `kv_cache.py`).
__all__ = ["Completion", "Engine", "SamplingParams", "load_model", "pick_device", "shared_prefixes"]

log = get_logger("inference")


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def load_model(path: str, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False):
    transformers.utils.logging.disable_progress_bar()  # a bar per weight update floods the log
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types; the message is what matters
        raise UserError(f"cannot load model from {path}: {exc}") from None
    if device.type == "cpu" and getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(attention.register())  # grouped-query heads without copying the cache (a
        # class that cannot switch keeps sdpa; on CUDA, transformers' own rule: masked enable_gqa is its slow path)
    return model.to(device).eval()


class Engine:
    """Generates completions for many concurrent requests on one model."""

    def __init__(self, model_path: str, *, context_len: int, seed: int = 0, device: str = "auto",
                 dtype: str = "float32", max_batch_size: int = 64, trust_remote_code: bool = False,
                 threads: int | None = None, prefix_cache_mib: int = 0):
        if threads is not None:
            # Process-wide. Small matmuls gain nothing from more threads, and OpenMP threads spinning on
            # cores the trainer also uses slowed a tiny model's decode step 10-20x (docs/benchmarks.md).
            torch.set_num_threads(threads)
        self.device = pick_device(device)
        self.dtype = getattr(torch, dtype)
        self.model = load_model(model_path, self.dtype, self.device, trust_remote_code)
        self.reference = Reference.from_model(self.model)  # what every weight update must match
        self._base = BaseWeights()  # W0 of the weights a LoRA adapter update changed
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        except Exception as exc:
            raise UserError(f"cannot load tokenizer from {model_path}: {exc}") from None
        model_max = getattr(self.model.config, "max_position_embeddings", None) or context_len
        self.context_len = min(context_len, model_max)
        self.eos_ids = self._eos_ids()
        # The ids that may be sampled: the tokenizer's, not the padded rows of the output embedding past it.
        self.vocab = min(tokenizer_vocab(self.tokenizer), self.model.config.vocab_size)
        self._states_are_hidden = head_output_is_logits(self.model)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.max_batch_size = max_batch_size
        self._seeds = torch.Generator().manual_seed(seed)
        self._scheduler = Scheduler(max_batch_size)  # the waiting requests and who starts next
        self._lock = threading.Lock()  # held while the model runs; apply_weights takes it
        self._turn = threading.Lock()  # held by an apply_weights waiting for `_lock`: the loop lets it go first
        self.weight_step = 0  # the step of the weights in the model; every sampled token records it
        self._stop = threading.Event()
        # The running batch: one row per sequence.
        self._seqs: list[Seq] = []
        self._batch = BatchCache()  # its KV cache and attention mask
        self.prefixes = PrefixStore(prefix_cache_mib * 2**20)  # finished sequences' caches, for their next turns
        self._next: torch.Tensor | None = None  # [B] sampled, not yet fed
        self._thread = threading.Thread(target=self._loop, name="builtin-engine", daemon=True)
        self._thread.start()

    def _eos_ids(self) -> set[int]:
        ids = set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (gen_eos, self.model.config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(value)
        return ids

    # ------------------------------------------------------------------ public API

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int = 1, owner: object = None) -> Future:
        """Queue `n` completions of `prompt_ids`; the future resolves to a list of `Completion`. Requests of one
        `owner` share its fair part of the batch (`scheduler.py`); None: this request is an owner of its own."""
        if not prompt_ids:
            raise UserError("the prompt is empty")
        overflow = context_overflow(len(prompt_ids), params.max_tokens, self.context_len)
        if overflow:
            raise UserError(overflow)
        return self._scheduler.submit(list(prompt_ids), params, n, owner)

    def stage_weights(self, source: WeightDir | str) -> Staged:
        """Read and check the weights of `source` (see `weight_check`; a LoRA adapter: `adapter_check`): an
        update's files, open (`weights.WeightDir`, read through the descriptors they were checked on), or a
        trusted directory's path; return them cast to the served dtype and device (an adapter: its float32
        deltas scale * B @ A and its saved weights), ready for `apply_weights`. Only `config.json` (compared,
        never applied) or `adapter_config.json` and the safetensors are read: no code from the directory runs
        and the architecture stays."""
        with opened(source) as weights:
            path = str(weights.path)
            if not weights.is_adapter:
                return self.stage_tensors(verify_weight_dir(weights, self.reference, keep=True), path, checked=True)
            adapter = verify_adapter_dir(weights, self.reference, keep=True)
        params = self.model.state_dict()
        staged = Staged({f"{module}.weight": lora_delta(a.to(self.device), b.to(self.device), adapter.scale)
                         for module, (a, b) in adapter.modules.items()}, adapter=True,
                        saved={name: t.to(device=self.device, dtype=params[name].dtype)
                               for name, t in adapter.saved.items()})
        return self._refuse_overflow(staged, path)

    def stage_tensors(self, tensors: dict[str, torch.Tensor], source: str, checked: bool = False) -> Staged:
        """Full weights from `source` (a directory `verify_weight_dir` read, or a weight transfer), checked against
        the served model unless `checked`, cast to the served dtype and device, ready for `apply_weights`."""
        if not checked:
            verify_tensors(source, tensors, self.reference)
        params = self.model.state_dict()
        staged = Staged({name: t.to(device=self.device, dtype=params[name].dtype) for name, t in tensors.items()})
        return self._refuse_overflow(staged, source)

    def _refuse_overflow(self, staged: Staged, source: str) -> Staged:
        """`staged`, unless a value it would write is not finite in the served dtype (UserError)."""
        params = self.model.state_dict()
        # Finite inputs can still overflow: W0 + scale * B @ A, or a cast to float16 (> 65504). A weight that
        # turned inf would fail every later request, so such an update is refused before anything is applied.
        with torch.no_grad():
            for name, value in self._base.served(params, staged).items():
                if not bool(torch.isfinite(value).all()):
                    raise UserError(f"weight update {source}: {name} would not be finite in the served dtype "
                                    f"{params[name].dtype} (it overflows)")
        return staged

    def apply_weights(self, staged: Staged, step: int) -> None:
        """Write staged weights into the running model in place, as weight step `step` (an adapter: merged
        into the base weights, `merge.BaseWeights`).

        Waits for the loop's current iteration and goes before its next one, so never during a forward:
        running sequences go on with the new weights (their cache from the old ones is kept) and their
        later tokens record `step`."""
        params = self.model.state_dict()
        with self._turn, self._lock, torch.no_grad():
            self._base.apply(params, staged)
            self.weight_step = step
            self.prefixes.clear()  # computed under the old weights

    def reset(self) -> None:
        """Drop cached memory: the stored prefixes, and the device's cache of freed blocks."""
        with self._lock:
            self.prefixes.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._turn:  # a waiting apply_weights takes `_lock` before the next iteration does
                pass
            new: list[tuple[Request, int, int]] = []
            try:
                new = self._scheduler.admit(seq.request.owner for seq in self._seqs)
                with self._lock:
                    if new:
                        self._prefill(new)
                    if self._seqs:
                        self._decode()
            except Exception as exc:  # a bug must fail the requests it touches, not hang them
                log.exception("engine step failed")
                self._fail_all(exc, [request for request, _, _ in new])

    def _start(self, request: Request, first: int, count: int) -> list[Seq]:
        """Sequences `first` .. `first + count - 1` of one request, each with its own generator (choice i:
        seed + i)."""
        seqs = []
        for i in range(first, first + count):
            seed = request.params.seed + i if request.params.seed is not None else None
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
            seqs.append(Seq(request, i, torch.Generator().manual_seed(seed), start_step=self.weight_step))
        return seqs

    def _prefill(self, parts: list[tuple[Request, int, int]]) -> None:
        """Prefill each admitted request's prompt once (one left-padded row per request), then give each of its
        sequences starting now (`Scheduler.admit`'s parts) a copy of that row's cache and sample its first token
        from the row's logits. A prompt is scored (`prompt_logprobs`) with its request's first part."""
        started: list[tuple[Request, list[Seq]]] = []
        for request, first, count in parts:
            try:
                started.append((request, self._start(request, first, count)))
            except Exception as exc:  # a request that cannot start fails alone, not the batch
                log.warning(f"request failed before prefill: {type(exc).__name__}: {exc}")
                request.future.set_exception(exc)
        if not started:
            return
        requests = [request for request, _ in started]
        if any(request.params.prompt_logprobs for request in requests):  # every prompt position's states
            row_of = list(range(len(requests)))
            shared = shared_prefixes([r.prompt_ids if r.params.prompt_logprobs else None for r in requests])
            if shared is None:
                states, cache, mask = self._prefill_rows([r.prompt_ids for r in requests], all_positions=True)
            else:
                states, cache, mask = self._prefill_shared(requests, *shared)
            for row, (request, seqs) in enumerate(started):
                if request.params.prompt_logprobs and seqs[0].index == 0:
                    self._score_prompt(request, seqs, states[row, states.shape[1] - len(request.prompt_ids):])
            states = states[:, -1]
        else:  # one row per distinct prompt, each on its longest stored prefix
            distinct: dict[tuple[int, ...], int] = {}
            row_of = [distinct.setdefault(tuple(r.prompt_ids), len(distinct)) for r in requests]
            states, cache, mask = self._prefill_prompts([list(prompt) for prompt in distinct])
        counts = torch.tensor([len(seqs) for _, seqs in started])
        rows = torch.repeat_interleave(torch.tensor(row_of), counts)  # request r's row, once per sequence
        take_rows(cache, rows)
        seqs = [seq for _, request_seqs in started for seq in request_seqs]
        next_tokens = self._sample(seqs, self._logits(states)[rows])
        self._merge(seqs, cache, mask[rows], next_tokens)
        self._retire()

    def _prefill_rows(self, prompts: list[list[int]], all_positions: bool = False
                      ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """One left-padded forward of the prompts: states (`_forward`: [R, D] of the last position, or [R, S, D]
        of every position), the cache and its mask [R, S]."""
        ids, mask = left_padded(prompts, max(map(len, prompts)), self.pad_id)
        cache = DynamicCache()
        return self._forward(ids, mask, cache, all_positions=all_positions), cache, mask

    def _prefill_prompts(self, prompts: list[list[int]]) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """`_prefill_rows` of `prompts` (last-position states), each run only past its longest stored prefix
        (`PrefixStore.longest`): the stored keys and values, left-padded to a common width, are the cache the
        rests run on (a prompt without one: an empty, masked row). The cache and mask hold prefix padding,
        prefix, rest padding, rest; the states are what a full prefill computes."""
        stored = [self.prefixes.longest(prompt) for prompt in prompts]
        if all(found is None for found in stored):
            return self._prefill_rows(prompts)
        width = max(found[0] for found in stored if found is not None)
        cache, prefix_mask = stacked_cache([None if found is None else found[1] for found in stored], width)
        rests = [prompt if found is None else prompt[found[0]:] for prompt, found in zip(prompts, stored, strict=True)]
        ids, rest_mask = left_padded(rests, max(map(len, rests)), self.pad_id)
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        return self._forward(ids, mask, cache), cache, mask

    def _prefill_shared(self, requests: list[Request], group: list[int], shared: list[int]
                        ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
        """`_prefill_rows` in two forwards when scoring requests share prefixes (the samples of one prompt: the
        teacher's batch): first each group's shared prefix once (request r: group[r], its first shared[r]
        tokens; group -1: none), then every request's rest on a copy of its group's cache. Logits [R, S, V] of
        every position (a request's: its prefix's, then its rest's); the cache and mask hold prefix padding,
        prefix, rest padding, rest (the mask marks the padding, and positions count only real tokens).
        Computes what `_prefill_rows` does, on (sum of the shared prefixes) fewer tokens."""
        groups = max(group) + 1
        prefixes: list[list[int]] = [[] for _ in range(groups)]
        for request, g, length in zip(requests, group, shared, strict=True):
            if g >= 0:
                prefixes[g] = request.prompt_ids[:length]
        prefix_width = max(map(len, prefixes))
        ids, prefix_mask = left_padded(prefixes, prefix_width, self.pad_id)
        cache = DynamicCache()
        prefix_logits = self._forward(ids, prefix_mask, cache, all_positions=True)  # [G, P, D]
        rows = torch.tensor([max(g, 0) for g in group])
        take_rows(cache, rows)  # each request's copy of its group's prefix (group -1: a row masked out below)
        prefix_mask = prefix_mask[rows]
        prefix_mask[torch.tensor(group) < 0] = 0
        rests = [request.prompt_ids[length:] for request, length in zip(requests, shared, strict=True)]
        width = max(map(len, rests))
        ids, rest_mask = left_padded(rests, width, self.pad_id)
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        rest_logits = self._forward(ids, mask, cache, all_positions=True)  # [R, W, D]
        full = max(len(request.prompt_ids) for request in requests)
        logits = rest_logits.new_zeros((len(requests), full, rest_logits.shape[-1]))
        for row, (request, g, length) in enumerate(zip(requests, group, shared, strict=True)):
            rest = len(request.prompt_ids) - length  # right-aligned, as _prefill_rows's rows are
            logits[row, full - rest:] = rest_logits[row, width - rest:]
            if length:
                logits[row, full - rest - length:full - rest] = prefix_logits[g, prefix_width - length:]
        return logits, cache, mask

    def _decode(self) -> None:
        states = self._forward(self._next[:, None], self._batch.extend(), self._batch.cache)
        self._next = self._sample(self._seqs, self._logits(states))
        self._retire()

    def _score_prompt(self, request: Request, seqs: list[Seq], states: torch.Tensor) -> None:
        """(logprob, rank) of prompt token i >= 1 from the prefill's states [L, D] of its row, under the
        request's temperature without truncation: log_softmax(z_{i-1} / T)[prompt_i] (T = 0: untempered), over
        the sampled vocabulary. Logits are made `PROMPT_CHUNK_LOGITS` at a time, never [L, V] at once. A prompt
        token past the sampled vocabulary or a non-finite logprob fails the request alone."""
        if len(request.prompt_ids) < 2:  # a one-token prompt has no token after the first to score
            request.prompt_logprobs = []
            return
        targets = torch.tensor(request.prompt_ids[1:], dtype=torch.long)[:, None]
        top = max(request.prompt_ids[1:], default=0)
        if top >= self.vocab:
            fail_rows(seqs, ValueError(f"prompt token id {top} is past the vocabulary ({self.vocab} ids) and "
                                       "has no logprob"))
            return
        chunk = max(1, PROMPT_CHUNK_LOGITS // self.vocab)
        states = states[:-1]  # position i - 1 predicts token i
        chosen, ranks = [], []
        for start in range(0, len(targets), chunk):
            logprobs = processed_logprobs(self._logits(states[start:start + chunk]), request.params.temperature)
            picked = logprobs.gather(1, targets[start:start + chunk])
            chosen.append(picked[:, 0])
            ranks.append((logprobs > picked).sum(dim=1) + 1)
        chosen_all = torch.cat(chosen)
        if not torch.isfinite(chosen_all).all():
            fail_rows(seqs, FloatingPointError("the model gave a prompt token a non-finite logprob"))
            return
        request.prompt_logprobs = list(zip(chosen_all.tolist(), torch.cat(ranks).tolist(), strict=True))

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, cache: DynamicCache,
                 all_positions: bool = False) -> torch.Tensor:
        """States [B, D] of the last position ([B, S, D] of every input position with `all_positions`), on the
        model's device, that `_logits` turns into logits: the final hidden states (D = hidden size) when the
        model's logits are its head's output (`models.output_head`), else the logits themselves; `mask` covers
        cache + input."""
        positions = position_ids(mask, input_ids.shape[1])
        inputs = dict(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                      position_ids=positions.to(self.device), past_key_values=cache, use_cache=True)
        if not self._states_are_hidden:
            out = self.model(**inputs)
        else:
            with output_embedding_as(self.model, lambda hidden: hidden):
                out = self.model(**inputs, logits_to_keep=0 if all_positions else 1)
        return out.logits if all_positions else out.logits[:, -1]

    @torch.inference_mode()
    def _logits(self, states: torch.Tensor) -> torch.Tensor:
        """Float32 logits [..., vocab] on the CPU of `_forward`'s states: the sampled vocabulary only."""
        if self._states_are_hidden:
            states = self.model.get_output_embeddings()(states)
        return states[..., :self.vocab].float().cpu()

    def _sample(self, seqs: list[Seq], logits: torch.Tensor) -> torch.Tensor:
        """Sample the next token of every row; rows with the same sampling parameters in one batched call."""
        groups: dict[SamplingRule, list[int]] = {}
        for row, seq in enumerate(seqs):
            p = seq.request.params
            groups.setdefault(p.rule, []).append(row)
        tokens = torch.empty(len(seqs), dtype=torch.long)
        chosen = torch.empty(len(seqs), dtype=torch.float32)
        for rule, rows in groups.items():
            index = torch.tensor(rows)
            try:
                logprobs = processed_logprobs(logits[index], rule.temperature, rule.top_k, rule.top_p, rule.min_p)
                group_tokens = sample_rows(logprobs, rule.temperature, [seqs[row].generator for row in rows])
                group_logprobs = logprobs.gather(1, group_tokens[:, None])[:, 0]
                if not torch.isfinite(group_logprobs).all():
                    raise FloatingPointError("the model produced non-finite logprobs")
            except Exception as exc:  # fails the requests of this group only; the others go on
                fail_rows([seqs[row] for row in rows], exc)
                group_tokens, group_logprobs = torch.full((len(rows),), self.pad_id), torch.zeros(len(rows))
            tokens[index] = group_tokens
            chosen[index] = group_logprobs
        for seq, token, logprob in zip(seqs, tokens.tolist(), chosen.tolist(), strict=True):
            seq.token_ids.append(token)
            seq.logprobs.append(logprob)
            seq.weight_steps.append(self.weight_step)
        return tokens

    def _merge(self, seqs: list[Seq], cache: DynamicCache, mask: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Append new rows (their cache, mask and pending tokens) to the running batch."""
        self._batch.add(cache, mask)
        self._next = torch.cat([self._next, next_tokens]) if self._seqs else next_tokens
        self._seqs = self._seqs + seqs

    def _retire(self) -> None:
        """Finish sequences that hit EOS, a stop string or their length; shrink the batch."""
        gone, finished = [], []
        for row, seq in enumerate(self._seqs):
            if seq.failed:  # its request already failed (`fail_rows`): the row just leaves
                gone.append(row)
                continue
            done = seq.finished(self.tokenizer, self.eos_ids)
            if done is not None:
                seq.complete(*done)
                finished.append((row, seq))
                gone.append(row)
        self._store(finished)
        if not gone:
            return
        order = self._batch.retire(gone)
        self._seqs = [self._seqs[i] for i in order]
        self._next = self._next[torch.tensor(order)] if order else None

    def _store(self, finished: list[tuple[int, Seq]]) -> None:
        """Keep finished sequences' caches (their rows of the batch) for prompts that continue them: each one's
        prompt and every sampled token but the last (never fed), all computed under the current weights (none kept
        across an update; none for a scoring request, which no turn continues)."""
        if not self.prefixes.capacity:
            return
        kept = [(row, seq) for row, seq in finished
                if not seq.request.params.prompt_logprobs and seq.start_step == self.weight_step]
        if not kept:
            return
        for (_, seq), layers in zip(kept, row_caches(self._batch.cache, self._batch.mask, [r for r, _ in kept]),
                                    strict=True):
            ids = seq.request.prompt_ids + seq.token_ids[:-1]
            if layers[0][0].shape[1] == len(ids):
                self.prefixes.save(ids, layers)

    def _fail_all(self, exc: Exception, admitted: list[Request]) -> None:
        for request in [seq.request for seq in self._seqs] + admitted:
            if not request.future.done():
                request.future.set_exception(exc)
        self._seqs, self._next = [], None
        self._batch.reset()


PROMPT_CHUNK_LOGITS = 2**24  # logits made at once when scoring a prompt: 64 MB of float32

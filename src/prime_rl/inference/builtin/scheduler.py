"""The builtin engine's requests and their choices, apart from the model and the cache: what a request asks
(`SamplingParams`, `Request`), which waiting requests start and how many of their choices when slots of the
running batch are free (`Scheduler`), and how a running choice ends (`Seq`: finished, completed; `fail_rows`).
No torch: it sees requests, sequences and the owners of the running ones, never a tensor, so its rules are
tested on plain objects (tests/inference/builtin/test_scheduler.py).

Fair admission: every request has an owner (`Engine.submit(owner=...)`; the server gives each HTTP request its
own, so the prompts of one batched request share one). Each free slot goes to the owner with the fewest running
sequences (ties: the oldest waiting request), and a request's choices start a quarter of the batch at a time
(`PART`): an owner waits until a quarter of the batch (or all it has left) is free, except one running nothing
while another runs more than a quarter of the batch, which starts at the first free slot. So however many
choices one request asks for (64 prompts x n = 1024), another request's first choice starts as soon as one
running sequence finishes (at most that sequence's remaining max_tokens decode steps); its further choices then
start a quarter of the batch at a time, and slots freed meanwhile stay empty until a quarter is free (admission
serves the owner with the fewest running sequences first, so the larger request does not take them either).
docs/inference.md measures it.
Fairness is between requests: a caller that sends many requests at once (the orchestrator: one per group) is many
owners, and a request arriving behind them waits its turn among them, oldest first, as before.
"""

from __future__ import annotations

import itertools
import queue
from collections import Counter, deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prime_rl.models.sampling_rule import SamplingRule
from prime_rl.openai_api.protocol import Completion
from prime_rl.utils.logging import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger("inference")

PART = 4  # admission gives an owner max_batch_size / PART slots at a time (`Scheduler.admit`)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    prompt_logprobs: bool = False  # also score the prompt (`Engine._score_prompt`)

    @property
    def rule(self) -> SamplingRule:
        """The distribution this request samples from (rows with the same rule sample in one call)."""
        return SamplingRule(self.temperature, self.top_k, self.top_p, self.min_p)


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    future: Future
    owner: object = None  # who asked (`Scheduler.admit` shares slots fairly between owners)
    arrival: int = 0  # order of submission
    results: list[Completion | None] = field(default_factory=list)
    prompt_logprobs: list[tuple[float, int]] | None = None
    started: int = 0  # choices admitted so far (a request larger than the batch starts in parts)

    def __post_init__(self):
        self.results = [None] * self.n


@dataclass
class Seq:
    """One choice of a request while it runs: one row of the running batch."""

    request: Request
    index: int
    generator: torch.Generator
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_steps: list[int] = field(default_factory=list)
    text_len: int = 0  # characters of text already searched for stop strings
    failed: bool = False  # its request failed: the row is dropped at the next retire
    start_step: int = 0  # the weight step its prompt was prefilled under

    def finished(self, tokenizer, eos_ids: set[int]) -> tuple[str, str] | None:
        """(finish_reason, text) when this choice is done, else None."""
        p = self.request.params
        if p.stop:  # decode every step only when there are stop strings to look for
            text = tokenizer.decode(self.token_ids, skip_special_tokens=True)
            for stop in p.stop:
                # Only the newest token can have completed a stop string: search from just before it.
                at = text.find(stop, max(0, self.text_len - len(stop) + 1))
                if at >= 0:
                    return "stop", text[:at]
            self.text_len = len(text)
        if self.token_ids[-1] in eos_ids:
            return "stop", tokenizer.decode(self.token_ids, skip_special_tokens=True)
        if len(self.token_ids) >= p.max_tokens:
            return "length", tokenizer.decode(self.token_ids, skip_special_tokens=True)
        return None

    def complete(self, reason: str, text: str) -> None:
        """Record this choice's completion; the request's future resolves with its last choice."""
        request = self.request
        request.results[self.index] = Completion(self.token_ids, self.logprobs, text, reason, self.weight_steps,
                                                 request.prompt_logprobs)
        if all(r is not None for r in request.results) and not request.future.done():
            request.future.set_result(list(request.results))


def fail_rows(seqs: list[Seq], exc: Exception) -> None:
    """Fail the requests of these rows alone (their rows leave the batch at the next retire)."""
    log.warning(f"{len(seqs)} sequence(s) failed while sampling: {type(exc).__name__}: {exc}")
    for seq in seqs:
        seq.failed = True
        if not seq.request.future.done():
            seq.request.future.set_exception(exc)


class Scheduler:
    """The waiting requests, per owner in arrival order, and the admission rule (module docstring) for a batch of
    `max_batch_size` sequences. `submit` may be called from any thread; `admit` only from the engine's loop."""

    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self._queue: queue.Queue[Request] = queue.Queue()
        self.waiting: dict[object, deque[Request]] = {}  # per owner, in arrival order (the loop's own)
        self._arrivals = itertools.count()

    def submit(self, prompt_ids: list[int], params: SamplingParams, n: int, owner: object = None) -> Future:
        """Queue `n` choices of `prompt_ids` for `owner` (None: the request is an owner of its own); the engine
        resolves the future."""
        future: Future = Future()
        arrival = next(self._arrivals)
        self._queue.put(Request(prompt_ids, params, n, future, arrival if owner is None else owner, arrival))
        return future

    def admit(self, running_owners: Iterable[object]) -> list[tuple[Request, int, int]]:
        """(request, its first choice to start now, how many) for the slots the running sequences (one owner each
        in `running_owners`) leave free; blocks up to 50 ms for a submission when nothing runs or waits. Advances
        each request's `started`; a request whose future is done (it failed while an earlier part ran) starts no
        more choices."""
        running = Counter(running_owners)
        self._receive(block=not running and not self.waiting)
        free = self.max_batch_size - running.total()
        parts: dict[int, tuple[Request, int, int]] = {}  # by id(request): one part per request per round
        while self.waiting:
            owner = min(self.waiting, key=lambda o: (running[o], self.waiting[o][0].arrival))
            line = self.waiting[owner]
            request = line[0]
            left = request.n - request.started
            if request.future.done():  # failed while an earlier part ran: the rest never starts
                count = left
            else:
                # A quantum at a time, so free slots alternate between waiting owners; an owner waits for a whole
                # quantum (or all it has left: each admission is a prefill forward and a cache merge), except one
                # running nothing while another runs more than a quantum: that one starts at the first free slot.
                quantum = max(1, self.max_batch_size // PART)
                count = min(left, free, quantum)
                crowded_out = not running[owner] and max(running.values(), default=0) > quantum
                if count == 0 or (count < min(left, quantum) and not crowded_out):
                    break
                first, already = parts.get(id(request), (request, request.started, 0))[1:]
                parts[id(request)] = (request, first, already + count)
                running[owner] += count
                free -= count
            request.started += count
            if request.started == request.n:
                line.popleft()
                if not line:
                    del self.waiting[owner]
        return list(parts.values())

    def _receive(self, block: bool) -> None:
        """Move submitted requests into their owners' lines (waiting up to 50 ms for one when `block`)."""
        try:
            request = self._queue.get(timeout=0.05) if block else self._queue.get_nowait()
            while True:
                self.waiting.setdefault(request.owner, deque()).append(request)
                request = self._queue.get_nowait()
        except queue.Empty:
            return

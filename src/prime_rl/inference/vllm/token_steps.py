"""Which weight step sampled each token of a vLLM answer, for updates that happen while requests run.

vLLM >= 0.32 labels every engine step's output with the engine's *weight version*, a string set by
`engine_client.update_weight_version(v)`; a finished completion (`vllm.outputs.CompletionOutput`) carries
`weight_versions`, a list of spans `{version, start, end}` over its output-token indexes (half-open), one per
version its tokens were sampled under. The middleware sets the version to the served weight step at every update
(`str(step)`), so a request that ran across two in-flight updates has three spans. vLLM's OpenAI routes do not put
the spans in their JSON answers, so the middleware reads them where the routes get them: it wraps the engine
client's `generate` (`record_outputs`), and while it serves a generate request (`collecting`) every `generate`
call of that request keeps its final output's spans, in call order (a completions request calls it once per prompt,
in prompt order; choice k of prompt p is output k % n of call p).

`token_steps` turns a choice's spans into its per-token steps; a span whose version is not a step (vLLM's initial
"default", before any update) is the step the request was admitted under.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar
from typing import Any

Spans = list[tuple[str, int, int]]  # (version, start, end) over output-token indexes

_calls: ContextVar[list[dict[int, Spans | None]] | None] = ContextVar("prime_rl_vllm_generate_calls", default=None)
_WRAPPED = "_prime_rl_records_outputs"


def in_flight_problem(engine_client: Any) -> str | None:
    """Why this vLLM cannot take weights while requests run with exact per-token steps (None: it can): it needs
    `pause_generation(mode="keep")`, `resume_generation`, `update_weight_version` and completions that carry
    `weight_versions` (vLLM >= 0.32)."""
    for method in ("pause_generation", "resume_generation", "update_weight_version", "generate"):
        if not callable(getattr(engine_client, method, None)):
            return f"vLLM's engine client has no {method} (in-flight updates need vLLM >= 0.32)"
    try:
        from vllm.outputs import CompletionOutput
    except ImportError:
        return None  # a stand-in engine client (tests): its outputs say for themselves
    if "weight_versions" not in {f.name for f in dataclasses.fields(CompletionOutput)}:
        return "this vLLM's completions carry no weight_versions spans (in-flight updates need vLLM >= 0.32)"
    return None


def record_outputs(engine_client: Any) -> None:
    """Wrap `engine_client.generate` (once) so that calls made inside `collecting` keep their spans."""
    if getattr(engine_client, _WRAPPED, False):
        return
    generate = engine_client.generate

    def recorded(*args, **kwargs) -> AsyncIterator[Any]:
        calls = _calls.get()
        if calls is None:
            return generate(*args, **kwargs)
        calls.append({})  # at call time: the call order is the prompt order
        return _keep_spans(generate(*args, **kwargs), calls[-1])

    engine_client.generate = recorded
    setattr(engine_client, _WRAPPED, True)


async def _keep_spans(outputs: AsyncIterator[Any], into: dict[int, Spans | None]) -> AsyncIterator[Any]:
    async with contextlib.aclosing(outputs):  # closed with this one (a client gone): vLLM aborts the request now
        async for output in outputs:
            if getattr(output, "finished", False):
                for completion in output.outputs:
                    into[completion.index] = _spans_of(getattr(completion, "weight_versions", None))
            yield output


def _spans_of(spans: Any) -> Spans | None:
    if spans is None:
        return None
    return [(str(_field(s, "version")), int(_field(s, "start")), int(_field(s, "end"))) for s in spans]


def _field(span: Any, name: str) -> Any:
    return span[name] if isinstance(span, dict) else getattr(span, name)


@contextlib.contextmanager
def collecting() -> Iterator[list[dict[int, Spans | None]]]:
    """While open, the `generate` calls of the current request (and the tasks it starts) record their spans into
    the list it yields: one dict per call, output index -> spans."""
    token = _calls.set([])
    try:
        yield _calls.get()
    finally:
        _calls.reset(token)


def choice_spans(calls: list[dict[int, Spans | None]], choice: int, n: int) -> Spans | None:
    """The spans of answer choice `choice` of a request asking `n` completions per prompt (None: not recorded)."""
    prompt, index = divmod(choice, max(n, 1))
    return calls[prompt].get(index) if prompt < len(calls) else None


def token_steps(spans: Spans, count: int, admitted: int) -> list[int]:
    """Per-token weight steps of a completion of `count` tokens from its spans (module docstring); ValueError when
    the spans do not cover exactly its tokens."""
    steps: list[int] = []
    for version, start, end in spans:
        if start != len(steps) or end < start:
            raise ValueError(f"weight version spans {spans} do not tile the completion's {count} tokens")
        steps += [int(version) if version.isdigit() else admitted] * (end - start)
    if len(steps) != count:
        raise ValueError(f"weight version spans {spans} cover {len(steps)} of the completion's {count} tokens")
    return steps

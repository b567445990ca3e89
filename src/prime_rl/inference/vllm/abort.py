"""Aborting the requests vLLM runs: in-flight updates on a vLLM without weight-version spans
(`inference.vllm.in_flight_kv = "resubmit"`, as AReaL updates).

vLLM answers an aborted request with its tokens so far and `finish_reason: "abort"`. Such an update holds new
requests at the middleware's gate, as a drained one does, and aborts the running ones (again every
`gate.HURRY_S`, for one that reached vLLM after an abort) until every admitted request has answered; the weights
then load into an idle engine. So every answer, aborted or not, was sampled under the step it was admitted under,
and no update waits for the longest request. The orchestrator's client sends an aborted answer's prompt plus its
tokens again (that continuation is prefilled and sampled under the new weights) and joins the pieces
(`orchestrator/client.py`): each token keeps the step that sampled it, as AReaL counts versions per token.

vLLM's `pause_generation` aborts under two spellings: `mode="abort"` (the vLLMs with pause modes) and
`wait_for_inflight_requests=False` (the first ones that could pause).
"""

from __future__ import annotations

import inspect
from typing import Any

SPELLINGS = ({"mode": "abort"}, {"wait_for_inflight_requests": False})


def _abort_arguments(engine_client: Any) -> dict | None:
    """The arguments that make this engine client's `pause_generation` abort (None: it cannot)."""
    pause = getattr(engine_client, "pause_generation", None)
    if not callable(pause):
        return None
    parameters = inspect.signature(pause).parameters
    for spelling in SPELLINGS:
        if set(spelling) <= set(parameters):
            return spelling | ({"clear_cache": False} if "clear_cache" in parameters else {})
    return None


def abort_problem(engine_client: Any) -> str | None:
    """Why this vLLM cannot abort its running requests for an update (None: it can)."""
    if not callable(getattr(engine_client, "resume_generation", None)):
        return "vLLM's engine client has no resume_generation (in-flight updates need a vLLM that can pause)"
    if _abort_arguments(engine_client) is None:
        return "vLLM's engine client has no pause_generation that aborts running requests"
    return None


async def pause_aborting(engine_client: Any) -> None:
    """Abort every request vLLM runs now (each answers with its tokens so far); vLLM holds new ones until
    `resume_generation`."""
    await engine_client.pause_generation(**_abort_arguments(engine_client))

"""`POST /update_weights`: the contract every inference backend serves, implemented once.

A backend gives a `WeightLoader` (how it stages and applies weights, and whether it can swap them while
requests run); `update_weights(body, loader, weight_roots, gate)` does everything else, in this order:

1. `open_update_dir`: the directory must lie under an allowed root (else 403) and be a weights
   directory of step N (else 400); its files are opened here, once, and checked on their descriptors
   (`weight_dirs.py`), and stay open until the update is answered;
2. `"in_flight": true` on a loader that cannot (vLLM before 0.32) is a 400;
3. `loader.stage(weights, step)`: read (through those descriptors, never by name) and check the new
   weights (`weight_check` / `adapter_check`), or take the ones that came over the weight transfer group
   (a marker directory: the newest of step >= N, whose step is the one served) before any request is
   held: a bad update never holds traffic (400);
4. inside `gate.update(step, drain=not in_flight)` (`gate.py`: drain, or swap between decode steps; a loader
   whose `hurry` is set after `stage` drains in flight updates too, calling it until drained: vLLM's abort):
   `loader.apply(staged, step)`; a gate that cannot get through in time is a 503, a load that fails leaves
   the old step serving and is a 400 naming the directory;
5. one log line, and `{"weight_step": step}`.

Every answer is `(status, payload)`; errors carry `guard.error_payload`. Adding a backend means writing
its loader, not this flow.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any, Protocol

from prime_rl.inference.gate import GateTimeout, WeightGate
from prime_rl.inference.weight_dirs import WeightDir, WeightPathForbidden, open_update_dir
from prime_rl.openai_api.guard import error_payload
from prime_rl.openai_api.protocol import UpdateWeightsRequest
from prime_rl.utils.errors import UserError, first_line
from prime_rl.utils.logging import get_logger

log = get_logger("inference")


class WeightLoader(Protocol):
    """What a backend implements for `update_weights`."""

    in_flight: bool  # it can swap weights while requests run (between decode steps, or vLLM's kept pause)
    hurry: Any  # optional; after `stage`: None, or what makes running requests end now (an in-flight update drains)

    async def stage(self, weights: WeightDir, step: int) -> tuple[int, Any]:
        """Read and check the update whose files `weights` holds open (or take a transfer marker's weights): (the
        step to serve, what `apply` needs; the files stay open until `apply` returns). UserError / ValueError: the
        update is refused, nothing changed."""

    async def apply(self, staged: Any, step: int) -> None:
        """Make `staged` the served weights (called inside the gate)."""


async def update_weights(body: UpdateWeightsRequest, loader: WeightLoader, weight_roots: Any,
                         gate: WeightGate) -> tuple[int, dict]:
    """Serve one update request (module docstring): (HTTP status, JSON payload)."""
    start = time.monotonic()
    with ExitStack() as held:  # the update's files, open until it is answered
        try:
            weights = held.enter_context(open_update_dir(body.path, body.step, weight_roots))
            path = weights.path
            if body.in_flight and not loader.in_flight:
                why = getattr(loader, "in_flight_problem", None) or "the backend cannot swap weights under requests"
                raise UserError(f"in-flight weight update refused: {why}")
            step, staged = await loader.stage(weights, weights.step)
        except WeightPathForbidden as exc:
            return 403, error_payload(403, str(exc))
        except (UserError, ValueError) as exc:
            return 400, error_payload(400, str(exc))
        hurry = getattr(loader, "hurry", None) if body.in_flight else None
        try:
            async with gate.update(step, drain=not body.in_flight or hurry is not None, hurry=hurry):
                await loader.apply(staged, step)
        except GateTimeout as exc:
            return 503, error_payload(503, str(exc))
        except UserError as exc:
            return 400, error_payload(400, str(exc))
        except Exception as exc:  # a load that fails (a shape the check missed, ...) leaves the old step in place
            return 400, error_payload(400, f"cannot load weights from {path}: {first_line(exc)}")
    kind = "in flight" if body.in_flight else "drained"
    log.info(f"serving weights step {step} from {path} ({kind} update took {time.monotonic() - start:.2f}s)")
    return 200, {"weight_step": step}

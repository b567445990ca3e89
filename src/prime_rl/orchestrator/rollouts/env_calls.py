"""Calling a draw's environment (`respond`, `score_rollout`, `score_group`) under its timeout and its failure rule.

A call that raises or outlasts its timeout (`score_timeout_s`, `respond_timeout_s` of the draw's `EnvConfig`)
fails the rollout: it scores 0 (and with `on_error = "exclude"`, the default, trains nothing: `Group.trains`) with
a warning line naming the example (the first WARN_FIRST per environment, then
the 10th, 100th, ...: `worth_logging`), or, with `on_error = "fail"`, ends the run with that line
(`EnvironmentFailed`, exit code 2): an environment's bug never crashes the orchestrator with a traceback. Used by
scoring (`scoring.py`) and the multi-turn conversations (`multi_turn.py`) alike.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
from typing import Any

from prime_rl.orchestrator.examples.draws import Draw
from prime_rl.utils.errors import UserError
from prime_rl.utils.logging import get_logger

log = get_logger("orchestrator")
WARN_FIRST = 5  # failures logged one line each per environment; after that only the 10th, 100th, ...
_failures: collections.Counter[str] = collections.Counter()


class EnvironmentFailed(UserError):
    """An environment call raised or timed out, and its environment's on_error is "fail"."""


def worth_logging(count: int) -> bool:
    """Whether the `count`-th failure of a kind gets its own warning line: the first WARN_FIRST, then the 10th,
    100th, ..."""
    return count <= WARN_FIRST or math.log10(count).is_integer()


def report_failure(draw: Draw, why: str) -> str:
    """Log an environment failure of `draw` sparsely and return `why`; with on_error = "fail", raise it."""
    prompt = json.dumps(draw.example.prompt[-1]["content"] if draw.example.prompt else "")[:200]
    message = (f"environment '{draw.env}': {why} "
               f"(example prompt {prompt}, answer {json.dumps(draw.example.answer)[:100]})")
    if draw.config.on_error == "fail":
        raise EnvironmentFailed(message)
    _failures[draw.env] += 1
    count = _failures[draw.env]
    if worth_logging(count):
        outcome = "is left out of training" if draw.config.on_error == "exclude" else "scores 0"
        log.warning(f"{message}: the rollout {outcome} (failure {count} of this environment; rollout/env_error_frac)")
    return why


async def call_env(draw: Draw, what: str, call: Any, timeout_key: str) -> tuple[Any, str | None]:
    """(await call, None), or (None, why) when it raised or took longer than the environment config's
    `timeout_key` seconds (reported with `report_failure`)."""
    timeout = getattr(draw.config, timeout_key)
    try:
        return await asyncio.wait_for(call, timeout), None
    except TimeoutError:
        why = f"{what} took longer than {timeout_key} = {timeout:g}s"
    except EnvironmentFailed:
        raise
    except Exception as exc:  # an environment's bug must not end the run unless asked to
        why = f"{what} raised {type(exc).__name__}: {str(exc)[:300]}"
    return None, report_failure(draw, why)

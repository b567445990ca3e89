"""Adapter: a single-turn environment of the `verifiers` package behind our `Environment` protocol.

Used by `load_env` for an id that is not built in, when `verifiers` is installed (the
`verifiers` extra, pinned to 0.2.1: 0.3 moved this API to `verifiers.legacy` and 0.4
dropped it for agentic `verifiers.v1` environments, which run their own rollouts).

- `verifiers.load_environment(id, **args)` imports the module `id` (dashes become
  underscores) and calls its `load_environment(**args)`.
- The examples are the environment's dataset rows (`prompt` chat messages, `answer`,
  `info`, `task`), shuffled per pass with the seed.
- A completion is scored like verifiers scores a finished single-turn rollout: a
  `State.for_task(row)` with the completion as one assistant message goes through
  `rubric.score_rollout(state)`, which sets `state["reward"]` (the weighted sum of the
  reward functions: our `total`) and `state["metrics"]` (each function's value: our
  `components`).

Multi-turn/tool environments and group-level reward functions need verifiers' own rollout
loop and are refused with a config error.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from prime_rl.envs.base import Environment, Example, Reward
from prime_rl.utils.errors import PrimeError, UserError

ROW_KEY = "verifiers_row"  # Example.info key: the dataset row the example came from


def _rows(env_id: str, vf_env: Any) -> list[dict[str, Any]]:
    dataset = vf_env.get_dataset() if hasattr(vf_env, "get_dataset") else getattr(vf_env, "dataset", None)
    if dataset is None or len(dataset) == 0:
        raise UserError(f"verifiers environment '{env_id}' has no training dataset")
    return [dict(row) for row in dataset]


class VerifiersEnv(Environment):
    """Examples are the verifiers dataset rows, shuffled per pass with the seed; rewards come from its rubric."""

    def __init__(self, env_id: str, vf_env: Any, state_cls: Any):
        self.id = env_id
        self.vf_env = vf_env
        self.state_cls = state_cls
        self.rows = _rows(env_id, vf_env)

    def examples(self, seed: int = 0) -> Iterator[Example]:
        rng = random.Random(seed)
        order = list(range(len(self.rows)))
        while True:
            rng.shuffle(order)
            for i in order:
                row = self.rows[i]
                prompt = row.get("prompt")
                if not isinstance(prompt, list):
                    raise PrimeError(f"verifiers environment '{self.id}': row {i} has no chat 'prompt' list")
                info = {**(row.get("info") or {}), "task": row.get("task", "default"), ROW_KEY: i}
                yield Example(prompt=[dict(m) for m in prompt], answer=str(row.get("answer", "")), info=info)

    async def score(self, example: Example, completion: str) -> Reward:
        state = self.state_cls.for_task(self.rows[example.info[ROW_KEY]])
        state["completion"] = [{"role": "assistant", "content": completion}]
        await self.vf_env.rubric.score_rollout(state)
        metrics = {k: float(v) for k, v in (state.get("metrics") or {}).items()}
        return Reward(total=float(state["reward"]), components=metrics)


def load_verifiers_env(env_id: str, args: dict[str, Any]) -> Environment | None:
    """The verifiers environment `env_id`, or None when `verifiers` is not installed."""
    try:
        import verifiers
    except ImportError:
        return None
    if not hasattr(verifiers, "load_environment"):
        raise UserError(
            f"environment '{env_id}': verifiers {getattr(verifiers, '__version__', '?')} has no "
            "load_environment(id, ...); install the 'verifiers' extra (verifiers 0.2.1)"
        )
    try:
        vf_env = verifiers.load_environment(env_id, **args)
    except Exception as exc:  # verifiers raises whatever its module loader raises
        raise UserError(f"cannot load verifiers environment '{env_id}' with args {args}: {exc}") from None
    if not isinstance(vf_env, verifiers.SingleTurnEnv):
        raise UserError(f"verifiers environment '{env_id}' is a {type(vf_env).__name__}: only single-turn "
                        "environments (SingleTurnEnv) can be scored by prime-rl's orchestrator")
    if getattr(vf_env.rubric, "has_group_rewards", False):
        raise UserError(f"verifiers environment '{env_id}' has group-level reward functions, which are not supported")
    return VerifiersEnv(env_id, vf_env, verifiers.State)

"""Adapter: an environment of the `verifiers` package behind our `Environment` protocol.

Used by `load_env` for an id that is not built in, when `verifiers` is installed (the
`verifiers` extra). `verifiers.load_environment(id, **args)` builds the environment; its
dataset rows give `prompt` (chat messages), `answer`, `info`, `task`, and its rubric
scores a single-turn chat completion. Tested against a stand-in module with that API
(tests/unit/test_envs.py); against the real package only when the extra is installed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from prime_rl.orchestrator.envs.base import Environment, Example, Reward
from prime_rl.utils.errors import PrimeError, UserError


def _rows(vf_env: Any) -> list[dict[str, Any]]:
    dataset = vf_env.get_dataset() if hasattr(vf_env, "get_dataset") else getattr(vf_env, "dataset", None)
    if dataset is None or len(dataset) == 0:
        raise UserError(f"verifiers environment {type(vf_env).__name__} has no training dataset")
    return [dict(row) for row in dataset]


class VerifiersEnv(Environment):
    """Examples are the verifiers dataset rows, shuffled per pass with the seed; rewards come from its rubric."""

    def __init__(self, env_id: str, vf_env: Any):
        self.id = env_id
        self.vf_env = vf_env
        self.rows = _rows(vf_env)

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
                info = dict(row.get("info") or {})
                info["task"] = row.get("task", "default")
                yield Example(prompt=[dict(m) for m in prompt], answer=str(row.get("answer", "")), info=info)

    async def score(self, example: Example, completion: str) -> Reward:
        rubric = self.vf_env.rubric
        info = {k: v for k, v in example.info.items() if k != "task"}
        result = await rubric.score_rollout(
            prompt=example.prompt,
            completion=[{"role": "assistant", "content": completion}],
            answer=example.answer,
            state={},
            task=example.info.get("task", "default"),
            info=info,
        )
        metrics = {k: float(v) for k, v in (getattr(result, "metrics", None) or {}).items()}
        return Reward(total=float(result.reward), components=metrics)


def load_verifiers_env(env_id: str, args: dict[str, Any]) -> Environment | None:
    """The verifiers environment `env_id`, or None when `verifiers` is not installed."""
    try:
        import verifiers
    except ImportError:
        return None
    try:
        vf_env = verifiers.load_environment(env_id, **args)
    except Exception as exc:  # verifiers raises whatever its module loader raises
        raise UserError(f"cannot load verifiers environment '{env_id}' with args {args}: {exc}") from None
    return VerifiersEnv(env_id, vf_env)

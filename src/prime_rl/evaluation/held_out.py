"""The scoring behind `eval` (`launch/eval_command.py`): one builtin server and the orchestrator's evaluation
generation composed in one process, with no trainer and no run directory.

`score(inference, orchestrator)` serves `inference.model` in a thread (a free loopback port when `inference.port` is
0) and scores the held-out set `[orchestrator.eval]` scores during a run (its first `num_examples` eval examples per
environment, the same every time, each request seeded as there): a first pass, greedy (at `eval.temperature` when
`eval.rollouts` is 1, as a run evaluates; 0 by default), gives, per environment, `accuracy` (the fraction of
examples whose reward reaches `eval.success_threshold`), `reward` (the mean) and `tokens` (the mean completion
length, in tokens); with `eval.rollouts = k > 1` a second pass samples k completions per example at
`eval.temperature` for `pass@k` (the fraction of examples with at least one success), `sampled_reward` and
`sampled_tokens`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import torch

from prime_rl.inference.backends import BuiltinServer, builtin_server
from prime_rl.inference.config import InferenceConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.orchestrator.examples.draws import ExampleSource
from prime_rl.orchestrator.metrics import pass_at_k
from prime_rl.orchestrator.orchestrator import eval_draws, eval_generator, generate_eval, group_generator
from prime_rl.orchestrator.rollouts.scored_group import Group
from prime_rl.orchestrator.servers import ServerPool
from prime_rl.utils.errors import UserError

SERVER_START_S = 600.0

def _groups_table(groups: list[Group], threshold: float) -> dict[str, dict[str, float]]:
    """Per environment: examples, mean reward, success fraction of the first rollout, pass@k, mean tokens."""
    table = {}
    for env in dict.fromkeys(g.env for g in groups):
        mine = [g for g in groups if g.env == env]
        rewards = torch.tensor([g.rewards for g in mine], dtype=torch.float64)
        tokens = [sum(len(p.completion.token_ids) for p in g.trained(i)) for g in mine for i in range(len(g.rewards))]
        table[env] = {"examples": len(mine), "reward": float(rewards.mean()),
                      "accuracy": pass_at_k(rewards[:, :1] >= threshold),
                      "pass@k": pass_at_k(rewards >= threshold),
                      "tokens": sum(tokens) / max(len(tokens), 1)}
    return table


async def _generate(o: OrchestratorConfig, weights: tuple[Path, int] | None) -> dict[str, dict[str, float]]:
    e = o.eval
    envs = ExampleSource(o.env, o.seed).envs
    draws = eval_draws(o, envs)
    async with ServerPool(o.client) as client:
        await client.wait_ready()
        if weights is not None:  # as a run loads them: full weights, or an adapter merged into the base
            await client.update_weights(str(weights[0].absolute()), weights[1])
        generator = group_generator(o, envs, client)
        try:
            first = e.temperature if e.rollouts == 1 else 0.0  # one rollout: as the run evaluates (greedy: 0)
            greedy = _groups_table(await generate_eval(eval_generator(generator, 1, first), draws, o.seed),
                                   e.success_threshold)
            results = {env: {k: row[k] for k in ("examples", "accuracy", "reward", "tokens")}
                       for env, row in greedy.items()}
            if e.rollouts > 1:
                sampled = _groups_table(await generate_eval(eval_generator(generator, e.rollouts, e.temperature),
                                                            draws, o.seed), e.success_threshold)
                for env, row in sampled.items():
                    results[env] |= {f"pass@{e.rollouts}": row["pass@k"], "sampled_reward": row["reward"],
                                     "sampled_tokens": row["tokens"]}
        finally:
            await generator.stop()
    return results


def _serve(inference: InferenceConfig) -> tuple[BuiltinServer, threading.Thread]:
    """The builtin server of `inference`, serving in a daemon thread once it answers."""
    server = builtin_server(inference)
    thread = threading.Thread(target=server.serve, name="inference", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_S
    while not server.http.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise UserError("eval: the builtin inference server did not start (see the lines above)")
        time.sleep(0.05)
    return server, thread


def score(inference: InferenceConfig, orchestrator: OrchestratorConfig, weights: tuple[Path, int] | None = None
          ) -> dict[str, dict[str, float]]:
    """Per environment, the figures of the module docstring for the model `inference` serves, after loading
    `weights` (a run's weights/step_N directory and its step; it must lie under `inference.weight_dirs`) if given."""
    server, thread = _serve(inference)
    try:
        host, port = server.sock.getsockname()[:2]
        client = orchestrator.client.model_copy(update={"base_url": f"http://{host}:{port}/v1"})
        return asyncio.run(_generate(orchestrator.model_copy(update={"client": client}), weights))
    finally:
        server.stop()
        thread.join(timeout=30)

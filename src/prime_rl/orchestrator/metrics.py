"""Per-step orchestrator metrics (names documented in docs/metrics.md and docs/orchestrator.md)."""

from __future__ import annotations

from collections import defaultdict

import torch

from prime_rl.envs.environment import TOOL_ERROR_KINDS
from prime_rl.orchestrator.rollouts.agents.stitching import FORK_REASONS
from prime_rl.orchestrator.rollouts.scored_group import Group


def pass_at_k(solved: torch.Tensor) -> float:
    """Fraction of examples (rows of the bool [examples, k] tensor) with at least one solved rollout."""
    return float(solved.any(dim=1).float().mean()) if solved.numel() else 0.0


def _stats(prefix: str, values: list[float], names: tuple[str, ...] = ("mean", "std", "min", "max"),
           empty: float = 0.0) -> dict:
    """<prefix>/<name> of `values`; every one `empty` when there are none."""
    t = torch.tensor(values, dtype=torch.float64) if values else torch.full((1,), empty, dtype=torch.float64)
    table = {"mean": t.mean(), "std": t.std(correction=0), "min": t.min(), "max": t.max()}
    return {f"{prefix}/{name}": float(table[name]) for name in names}


def reward_metrics(groups: list[Group]) -> dict[str, float]:
    """reward/mean|std|min|max over all rollouts but those left out of training (`Group.trains`: a failure's 0 is
    not a score); reward/<env>/mean and reward/<env>/<component> per env."""
    scored = [(g, i) for g in groups for i in range(len(g.rewards)) if g.trains(i)]
    metrics = _stats("reward", [g.rewards[i] for g, i in scored], empty=float("nan"))  # no score: not a 0
    by_env: dict[str, list[float]] = defaultdict(list)
    components: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for g, i in scored:
        by_env[g.env].append(g.rewards[i])
        for name, value in (g.components[i] if i < len(g.components) else {}).items():
            components[g.env][name].append(value)
    for env, values in by_env.items():
        metrics[f"reward/{env}/mean"] = sum(values) / len(values)
        for name, vals in components[env].items():
            metrics[f"reward/{env}/{name}"] = sum(vals) / len(vals)
    return metrics


def rollout_metrics(groups: list[Group], step: int) -> dict[str, float]:
    """seq_len/*, rollout/truncated_frac, rollout/env_error_frac, rollout/excluded_frac (failed rollouts left out of
    training), async/policy_lag_* (per rollout: its oldest token) and
    async/token_lag_* (per completion token: step - the weight step it was sampled under) over all
    generated rollouts."""
    samples = [piece for g in groups for piece in g.all_trained()]
    prompt_lens = [len(p.prompt_ids) for p in samples]
    completion_lens = [len(p.completion.token_ids) for p in samples]
    rollouts = [c for g in groups for c in g.result.completions]  # an agent rollout's: its last segment
    truncated = [c.truncated for c in rollouts]
    env_errors = sum(e is not None for g in groups for e in g.errors)
    lags = [step - g.policy_step(i) for g in groups for i in range(len(g.rewards))]
    token_lags = [step - s for p in samples for s in p.completion.weight_steps]
    n = max(len(rollouts), 1)
    return turn_metrics(groups) | {
        "async/token_lag_mean": sum(token_lags) / max(len(token_lags), 1),
        "async/token_lag_max": float(max(token_lags, default=0)),
        "seq_len/prompt_mean": sum(prompt_lens) / max(len(samples), 1),
        "seq_len/completion_mean": sum(completion_lens) / max(len(samples), 1),
        "seq_len/completion_max": float(max(completion_lens, default=0)),
        "rollout/truncated_frac": sum(truncated) / n,
        "rollout/env_error_frac": env_errors / n,
        "rollout/excluded_frac": sum(not g.trains(i) for g in groups for i in range(len(g.rewards))) / n,
        "async/policy_lag_mean": sum(lags) / n,
        "async/policy_lag_max": float(max(lags, default=0)),
    }


def turn_metrics(groups: list[Group]) -> dict[str, float]:
    """Per rollout means of how its conversation went: policy turns, tool calls, tool errors by kind, environment
    response time (per `respond` call), context truncation, and the sampled and environment tokens per turn."""
    stats = [s for g in groups for s in g.stats]
    n = max(len(stats), 1)
    turns = max(sum(s.turns for s in stats), 1)
    sampled, env = sum(s.sampled_tokens for s in stats), sum(s.env_tokens for s in stats)
    metrics = {
        "rollout/turns_mean": sum(s.turns for s in stats) / n,
        "rollout/tool_calls_mean": sum(s.tool_calls for s in stats) / n,
        "rollout/context_truncated_frac": sum(s.context_truncated for s in stats) / n,
        "rollout/reasoning_chars_mean": sum(s.reasoning_chars for s in stats) / n,
        "rollout/unfinished_reasoning_frac": sum(s.unfinished_reasoning for s in stats) / n,
        "rollout/env_response_s": sum(s.env_s for s in stats) / max(sum(s.env_calls for s in stats), 1),
        "rollout/sampled_token_frac": sampled / max(sampled + env, 1),
        "seq_len/sampled_per_turn": sampled / turns,
        "seq_len/env_per_turn": env / turns,
        "rollout/segments_mean": sum(s.segments for s in stats) / n,
    }
    for reason in FORK_REASONS:
        metrics[f"rollout/forks/{reason}"] = sum(s.forks[reason] for s in stats) / n
    for kind in TOOL_ERROR_KINDS:
        metrics[f"rollout/tool_errors/{kind}"] = sum(s.tool_errors[kind] for s in stats) / n
    return metrics


def advantage_metrics(advantages: torch.Tensor, trained: torch.Tensor) -> dict[str, float]:
    """advantage/mean|std over the rollouts that train (`trained`, bool of the same shape: a failure left out of its
    group has no advantage)."""
    return _stats("advantage", advantages[trained].tolist(), ("mean", "std"))


def eval_metrics(groups: list[Group], threshold: float) -> dict[str, float]:
    """eval/<env>/reward (mean over all rollouts) and eval/<env>/pass@k (k = eval.rollouts, named literally
    'pass@k')."""
    metrics = {}
    for env in dict.fromkeys(g.env for g in groups):
        rows = [g.rewards for g in groups if g.env == env]
        rewards = torch.tensor(rows, dtype=torch.float64)
        metrics[f"eval/{env}/reward"] = float(rewards.mean())
        metrics[f"eval/{env}/pass@k"] = pass_at_k(rewards >= threshold)
    return metrics

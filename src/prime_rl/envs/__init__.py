"""Environments: prompts with answers, and the reward functions that score completions.

    from prime_rl.envs import load_env
    env = load_env("reverse-text", min_len=5, max_len=12)
    example = next(env.examples(seed=0))
    reward = await env.score(example, completion_text)   # Reward(total, components)

See docs/orchestrator.md for the built-ins and how to add one.
"""

from prime_rl.envs import (  # noqa: F401  (each registers its built-in)
    agent,
    alphabet_sort,
    arithmetic,
    calculator,
    dataset,
    reasoning_gym_env,
    reverse_text,
    reverse_text_hint,
)
from prime_rl.envs.environment import Environment, Example, Reward, SyntheticEnvironment
from prime_rl.envs.registry import ENVIRONMENTS, load_env, register_env

__all__ = ["ENVIRONMENTS", "Environment", "Example", "Reward", "SyntheticEnvironment", "load_env", "register_env"]

"""`PRIME_*` environment variables that set no config key.

pydantic-settings silently skips an environment variable that matches no field, so a typo
(`PRIME_MAX_STEPZ=3`) would run with the default. The rule, for the command being built:

- a variable that names one of its keys (`PRIME_MAX_STEPS`, `PRIME_TRAINER__OPTIM__LR`; any
  key below a dict or list key) is used; prime-rl's own internal variables are skipped;
- one that is clearly meant as one of its keys but names none is an error: it goes into one
  of the command's sections (`PRIME_TRAINER__OPTIM__LRR`), or is a near miss of a key
  (`PRIME_MAX_STEPZ`, `PRIME_TRAINER_OPTIM_LR` with single underscores);
- anything else is ignored with a one-line warning. Not an error, because `PRIME_` is a
  shared namespace: other tools (and other prime-rl commands, e.g. `PRIME_TRAINER__...`
  exported for `rl` while running `trainer`) use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from pydantic import BaseModel

from prime_rl.configs.describe import describe
from prime_rl.utils.errors import ConfigError

ENV_PREFIX = "PRIME_"
ENV_NESTED_DELIMITER = "__"
"""A key's variable: ENV_PREFIX + the dotted key upper-cased with each dot as ENV_NESTED_DELIMITER (`env_name`);
the settings base class (`configs/base.py`) reads the variables by the same two."""

INTERNAL_ENV_VARS = frozenset({
    "PRIME_INFERENCE_UPDATE_TIMEOUT_S",  # inference.vllm.middleware.TIMEOUT_ENV, set for the vLLM server
    "PRIME_INFERENCE_CONTEXT_LEN",  # inference.vllm.middleware.CONTEXT_ENV, set for the vLLM server
    "PRIME_INFERENCE_POLICY",  # inference.access.POLICY_ENV, set for the vLLM server
    "PRIME_INFERENCE_SERVED_NAME",  # inference.vllm.middleware.SERVED_NAME_ENV, the adapter alias for vLLM
    "PRIME_INFERENCE_WEIGHT_TRANSFER",  # inference.vllm.middleware.TRANSFER_ENV, the transfer group for vLLM
    "PRIME_INFERENCE_IN_FLIGHT_KV",  # inference.vllm.middleware.IN_FLIGHT_KV_ENV, vllm.in_flight_kv for vLLM
    "PRIME_JUDGE_BASE_URL",  # envs.judge.RL_JUDGE_ENV, the judge server rl starts ([judge])
    "PRIME_JUDGE_MODEL",
    "PRIME_JUDGE_API_KEY",
    "PRIME_START_GATE",  # utils.start_gate.START_GATE_ENV, set for a child rl starts gated (the orchestrator)
})
"""Variables prime-rl sets for its own processes; never config keys (a unit test finds any new one in src/)."""

NEAR_MISS = 0.8
"""difflib similarity (0-1) above which an unknown name counts as a typo of a key."""


def env_name(key: str) -> str:
    """`trainer.optim.lr` -> `PRIME_TRAINER__OPTIM__LR`."""
    return ENV_PREFIX + key.upper().replace(".", ENV_NESTED_DELIMITER)


def _key(name: str) -> str:
    """`PRIME_TRAINER__OPTIM__LR` -> `trainer.optim.lr` (pydantic-settings matches case-insensitively)."""
    return name[len(ENV_PREFIX):].lower().replace(ENV_NESTED_DELIMITER, ".")


def unknown_env_vars(config_cls: type[BaseModel], environ: Mapping[str, str]) -> list[str]:
    """The `PRIME_*` names in `environ` that set nothing in `config_cls` (to warn about).

    Raises ConfigError for a name that is meant as a key of `config_cls` but names none.
    """
    command = getattr(config_cls, "command", "") or config_cls.__name__
    rows = describe(config_cls)
    keys = {row.key for row in rows if not row.is_section}
    sections = {".".join(parts[:i]) for key in keys for parts in [key.split(".")] for i in range(1, len(parts))}
    open_keys = [row.key for row in rows if row.type.startswith(("dict", "list"))]
    ignored = []
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or name.upper() in INTERNAL_ENV_VARS:
            continue
        key = _key(name)
        if not key or key in keys or key in sections or any(key.startswith(k + ".") for k in open_keys):
            continue
        close = difflib.get_close_matches(key, keys, n=1, cutoff=NEAR_MISS)
        if close:
            raise ConfigError(f"environment variable {name} is not a config key of {command}; "
                              f"did you mean {env_name(close[0])}?")
        if "." in key and key.split(".")[0] in sections:
            raise ConfigError(f"environment variable {name} is not a config key of {command} "
                              f"(no key '{key}'; see `{command} --help`)")
        ignored.append(name)
    return ignored

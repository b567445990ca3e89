"""An advantage type defined in a test, in `ADVANTAGES` for the duration of a `with` block, as if
`configs/advantage.py` declared it: the configs that hold an `[advantage]` section (the orchestrator's, the
trainer's and `rl`'s, which nests both) accept its `type` in TOML and on the command line while it is registered.

The config union is built when `configs/advantage.py` is imported, and the registry refuses a config registered
after that (it would be missing from the union); a test's type therefore goes into the registry directly, and the
models are rebuilt with the union extended, then rebuilt as they were when the block ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prime_rl.configs.advantage import ADVANTAGES, AdvantageBase
from prime_rl.configs.extensions import registered_name
from prime_rl.launch.rl_config import RLConfig
from prime_rl.orchestrator.config import OrchestratorConfig
from prime_rl.trainer.config import TrainerConfig

SECTIONS = (OrchestratorConfig, TrainerConfig)  # the models with an `advantage` field; RLConfig nests them


def _rebuild(annotations: list[Any]) -> None:
    for model, annotation in zip(SECTIONS, annotations, strict=True):
        model.model_fields["advantage"].annotation = annotation
        model.model_rebuild(force=True)
    RLConfig.model_rebuild(force=True)


@contextmanager
def registered_advantage(config_cls: type[AdvantageBase], implementation: Callable[..., Any]) -> Iterator[None]:
    """Register `config_cls` (under its `type`) and its `implementation` until the block ends."""
    name = registered_name(config_cls)
    if name in ADVANTAGES.configs:
        raise ValueError(f"advantage '{name}' is registered already")
    originals = [model.model_fields["advantage"].annotation for model in SECTIONS]
    implementations = dict(ADVANTAGES._implementations)
    ADVANTAGES.configs[name] = config_cls
    ADVANTAGES.implements(config_cls)(implementation)
    _rebuild([ADVANTAGES.union()] * len(SECTIONS))  # the registered classes, this one included
    try:
        yield
    finally:
        del ADVANTAGES.configs[name]
        ADVANTAGES._implementations.clear()
        ADVANTAGES._implementations.update(implementations)
        _rebuild(originals)

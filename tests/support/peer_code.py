"""The peers' own code, run as shipped, where a test compares our math with theirs.

verl's rollout-correction helper (`verl/trainer/ppo/rollout_corr_helper.py`) and its presets
(`verl/trainer/config/algorithm.py`) are loaded from the verl wheel that `.ci/run` unpacks without its dependencies
(`INSTALL`, the wheel pinned by its hash in `.ci/peer_code.txt`): verl's package imports ray and a
training stack, so only the files the helper needs are executed, each from the wheel (the masked reductions of
`verl/utils/torch_functional.py` included); the modules around them that hold no math (`verl.protocol`'s
DataProto, the actor's config class, the device helpers) are replaced by minimal stand-ins.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

VERL_VERSION = "0.9.1"
PEERS_DIR = Path(__file__).resolve().parents[2] / ".peers"
VERL_ROOT = PEERS_DIR / f"verl-{VERL_VERSION}" / "verl"
INSTALL = f"uv pip install --no-deps --require-hashes --target .peers/verl-{VERL_VERSION} -r .ci/peer_code.txt"


def _package(name: str, path: Path | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []
    sys.modules[name] = module
    return module


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _DataProto:
    """verl.protocol.DataProto as the helper uses it: a holder of named tensors."""

    def __init__(self, tensors: dict):
        self.batch = tensors

    @classmethod
    def from_dict(cls, tensors: dict) -> _DataProto:
        return cls(dict(tensors))


def verl_modules() -> tuple[types.ModuleType, types.ModuleType]:
    """(rollout_corr_helper, algorithm) from the verl wheel; skips with the command to run when it is absent."""
    if not (VERL_ROOT / "trainer" / "ppo" / "rollout_corr_helper.py").is_file():
        pytest.skip(f"verl {VERL_VERSION}'s code is not unpacked here (.ci/run does it: {INSTALL})")
    if "verl.trainer.ppo.rollout_corr_helper" in sys.modules:
        return sys.modules["verl.trainer.ppo.rollout_corr_helper"], sys.modules["verl.trainer.config.algorithm"]
    saved = {k: v for k, v in sys.modules.items() if k == "verl" or k.startswith(("verl.", "tensordict"))}
    _package("verl", VERL_ROOT)
    _package("verl.utils", VERL_ROOT / "utils")
    device = types.ModuleType("verl.utils.device")
    device.get_device_name = lambda: "cpu"
    device.get_torch_device = lambda: __import__("torch").cpu
    device.is_npu_available = False
    sys.modules["verl.utils.device"] = device
    if "tensordict" not in sys.modules:
        tensordict = types.ModuleType("tensordict")
        tensordict.TensorDict = dict
        sys.modules["tensordict"] = tensordict
    protocol = types.ModuleType("verl.protocol")
    protocol.DataProto = _DataProto
    sys.modules["verl.protocol"] = protocol
    _package("verl.workers")
    _package("verl.workers.config")
    actor = types.ModuleType("verl.workers.config.actor")
    actor.PolicyLossConfig = dict
    sys.modules["verl.workers.config.actor"] = actor
    _package("verl.trainer", VERL_ROOT / "trainer")
    _package("verl.trainer.config", VERL_ROOT / "trainer" / "config")
    _package("verl.trainer.ppo", VERL_ROOT / "trainer" / "ppo")
    _load("verl.base_config", VERL_ROOT / "base_config.py")
    _load("verl.utils.torch_functional", VERL_ROOT / "utils" / "torch_functional.py")
    algorithm = _load("verl.trainer.config.algorithm", VERL_ROOT / "trainer" / "config" / "algorithm.py")
    helper = _load("verl.trainer.ppo.rollout_corr_helper", VERL_ROOT / "trainer" / "ppo" / "rollout_corr_helper.py")
    for key in [k for k in sys.modules if (k == "verl" or k.startswith(("verl.", "tensordict"))) and k not in saved]:
        if key not in ("verl.trainer.ppo.rollout_corr_helper", "verl.trainer.config.algorithm"):
            sys.modules.pop(key)
    return helper, algorithm

"""prime-rl's commands run in the test's process, as their console scripts run them."""

from __future__ import annotations

import contextlib
import importlib
import io
import subprocess

import pytest

MAINS = {"rl": "prime_rl.launch.rl:main", "trainer": "prime_rl.trainer.rl.train:main",
         "sft": "prime_rl.trainer.sft.train:main", "orchestrator": "prime_rl.orchestrator.orchestrator:main",
         "inference": "prime_rl.inference.server:main", "eval": "prime_rl.launch.eval_command:main"}


def run_entrypoint(command: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`command args` as its console script runs it (`main(argv)`), in this process: the exit code, stdout and
    stderr, with the PRIME_* variables of `env` set for the call."""
    module, name = MAINS[command].split(":")
    main = getattr(importlib.import_module(module), name)
    out, err, code = io.StringIO(), io.StringIO(), 0
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess([command, *args], code, out.getvalue(), err.getvalue())

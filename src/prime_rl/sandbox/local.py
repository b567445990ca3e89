"""Untrusted code on this machine: `LocalSandbox.run(solution, cases)` starts one sandboxed harness
(`sandbox/harness.py`) per evaluation and yields one `CaseResult` per case as the harness reports it.

Levels (`sandbox = ...`), strongest first; "auto" takes the first that works here (probed once per process):

- "bwrap": bubblewrap (Debian's `bubblewrap`): new PID, network, IPC and UTS namespaces (and a user namespace when
  not root); a fresh root holding only /usr (and its /bin, /lib links), /etc and the Python installation, all
  read-only; a size-capped tmpfs /tmp as the only writable place; a new /proc and a minimal /dev. The run
  directory, the home directory and every other path are not there at all.
- "unshare": util-linux `unshare` (on every Linux): new user, mount, PID, network, IPC and UTS namespaces; every
  mount read-only and size-capped tmpfs over /tmp, /var/tmp and /dev/shm. Paths are readable (not writable).
- "none": no isolation: a temporary directory, the rlimits, a stripped environment and a process group; allowed
  only when the config says so, and logged on every start.

Every level: a fresh directory per evaluation; the environment holds only PATH, LANG, HOME (the work directory)
and PYTHONIOENCODING (no API keys, no run paths, nothing of the orchestrator's); the harness is in its own process
group, killed at its deadline and when the orchestrator dies (`PR_SET_PDEATHSIG`); what it prints is read up to a
cap (cases x output limit), so a flood of output costs the orchestrator no memory; root switches to an
unprivileged uid of its own per concurrent evaluation (`slot_uid`) before any case runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import marshal
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.sandbox.limits import CaseResult, Limits
from prime_rl.utils.errors import UserError
from prime_rl.utils.loop_limit import LoopLimit
from prime_rl.utils.process_groups import signal_group

logger = logging.getLogger(__name__)

LEVELS = ("auto", "bwrap", "unshare", "none")
HARNESS = Path(__file__).with_name("harness.py")
SANDBOX_WORKDIR = "/tmp/work"
"""The evaluation's directory inside `bwrap` (a tmpfs /tmp of its own)."""
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
"""Where the `unshare` level mounts writable tmpfs (each that holds none of the Python paths the sandbox needs)."""
SLOT_UID_BASE = 1_000_000
"""Root's sandboxes run as uid SLOT_UID_BASE + (pid % 100,000) * 1,000 + slot: one uid per concurrent evaluation
of one orchestrator, so the process limit (counted per uid) is each evaluation's own."""
SANDBOX_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxFailed(RuntimeError):
    """The sandbox itself could not run (not the code in it): the rollout fails under `on_error`."""


@dataclass(frozen=True)
class Slot:
    index: int

    @property
    def uid(self) -> int:
        return SLOT_UID_BASE + (os.getpid() % 100_000) * 1_000 + self.index


class _Slots:
    """The slots (uids) of the evaluations running in this process, one each; shared by every sandbox of the process
    so that two environments never hand out the same uid (1,000 at most at once, far above any `max_concurrency`)."""

    def __init__(self) -> None:
        self._free: list[int] = list(range(1_000))

    @contextlib.contextmanager
    def take(self):
        index = self._free.pop(0)
        try:
            yield Slot(index)
        finally:
            self._free.append(index)


_SLOTS = _Slots()


def sandbox_env(workdir: str) -> dict[str, str]:
    return {"PATH": SANDBOX_ENV_PATH, "LANG": "C.UTF-8", "HOME": workdir, "PYTHONIOENCODING": "utf-8"}


def bwrap_argv(python: str, tmp_bytes: int) -> list[str]:
    """bubblewrap: a new root of read-only system paths and the Python installation, a writable tmpfs /tmp."""
    argv = ["bwrap", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv"]
    if os.getuid() == 0:  # the harness switches to its slot uid itself; it needs just these two for that
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    # /tmp first: Python paths under it (a virtual environment in a temporary checkout) are bound on top of it.
    argv += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
    paths = _python_paths(python)
    for parent in sorted({str(p) for path in paths for p in Path(path).parents if str(p) not in ("/", "/tmp")},
                         key=len):
        argv += ["--perms", "0755", "--dir", parent]  # bwrap would copy a parent's mode: /root is 0700
    for path in paths:
        argv += ["--ro-bind", path, path]
    argv += ["--ro-bind-try", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev", "--chdir", "/tmp"]
    for key, value in sandbox_env(SANDBOX_WORKDIR).items():
        argv += ["--setenv", key, value]
    return [*argv, "--", python]


def _python_paths(python: str) -> list[str]:
    """/usr plus the directories the sandbox's Python needs (its installation, a virtual environment, the
    packages it imports from), outermost first, without duplicates inside each other."""
    candidates = ["/usr", sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(python)),
                  os.path.dirname(python)]
    candidates += _site_paths()
    kept: list[str] = []
    for path in sorted({os.path.realpath(p) for p in candidates if os.path.exists(p)}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def unshare_argv(python: str) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork",
            "--kill-child", "--mount-proc", "--", python] if os.getuid() != 0 else [
            "unshare", "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc",
            "--", python]


def harness_argv(level: str, python: str, limits: Limits) -> list[str]:
    """The command that starts the harness. bubblewrap kills the sandbox when the orchestrator dies
    (`--die-with-parent`); the other levels get that from util-linux `setpriv --pdeathsig KILL` where it exists.
    (Not from a `preexec_fn`: that would make every start fork the orchestrator's whole address space on its event
    loop instead of the cheap `vfork`.)"""
    prefix = {"bwrap": lambda: bwrap_argv(python, limits.tmp_bytes), "unshare": lambda: unshare_argv(python),
              "none": lambda: [python]}[level]()
    if level != "bwrap" and shutil.which("setpriv"):
        prefix = ["setpriv", "--pdeathsig", "KILL", "--", *prefix]
    return [*prefix, "-I", "-S", "-B", "-c", _harness_source()]


@functools.cache
def scratch_dirs(python: str) -> list[str]:
    """SCRATCH_DIRS that exist and hold none of the sandbox Python's paths (a tmpfs over one would hide them)."""
    paths = _python_paths(python)
    return [d for d in SCRATCH_DIRS if os.path.isdir(d) and not any(p == d or p.startswith(d + "/") for p in paths)]


def workdir_for(level: str, python: str, host_dir: str) -> str:
    """The evaluation's directory: a host temporary directory (`none`), the tmpfs /tmp of bwrap, or `unshare`'s
    first scratch tmpfs."""
    if level == "none":
        return host_dir
    if level == "bwrap":
        return SANDBOX_WORKDIR
    scratch = scratch_dirs(python)
    if not scratch:
        raise SandboxFailed(f"unshare: every scratch directory ({', '.join(SCRATCH_DIRS)}) holds Python's files")
    return scratch[0] + "/work"


def encode_job(level: str, slot: Slot, workdir: str, solution: str, cases: Sequence[dict[str, Any]],
               limits: Limits, python: str) -> bytes:
    """The harness's job (its module docstring), marshalled: cheaper to read inside than JSON."""
    cases = [{**c, "args": json.loads(c["args"])} if c["kind"] == "call" else dict(c) for c in cases]
    return marshal.dumps({"level": level, "slot_uid": slot.uid, "workdir": workdir, "paths": _site_paths(),
                          "scratch": scratch_dirs(python), "solution": solution, "cases": cases,
                          "limits": limits.as_job()})


@functools.cache
def _site_paths() -> list[str]:
    return [p for p in sys.path if p and os.path.isdir(p) and "site-packages" in p]


@functools.cache
def _harness_source() -> str:
    return HARNESS.read_text()


@functools.cache
def level_works(level: str, python: str) -> str:
    """"" when `level` runs a case here, else why not (probed once per process: one tiny harness run)."""
    tool = {"bwrap": "bwrap", "unshare": "unshare"}.get(level)
    if tool and shutil.which(tool) is None:
        return f"{tool} is not installed"
    with tempfile.TemporaryDirectory(prefix="prime-rl-sandbox-probe-") as tmp:
        try:
            job = encode_job(level, Slot(999), workdir_for(level, python, tmp), "print(6 * 7)",
                             [{"kind": "stdio", "stdin": ""}], Limits(), python)
            done = subprocess.run(harness_argv(level, python, Limits()), input=job, capture_output=True,
                                  timeout=30, env=sandbox_env(tmp), cwd=tmp)
        except (OSError, subprocess.TimeoutExpired, SandboxFailed) as exc:
            return f"{type(exc).__name__}: {exc}"
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode == 0 and lines and json.loads(lines[-1]).get("stdout") == "42\n":
        return ""
    return (done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]


def choose_level(requested: str, python: str = sys.executable) -> str:
    """The level to use for `requested` ("auto": the strongest that works); a one-line UserError when the asked
    level does not work here, or when none does."""
    if requested not in LEVELS:
        raise UserError(f"sandbox must be one of {', '.join(LEVELS)}, not {requested!r}")
    if requested == "none":
        return "none"
    tried = ("bwrap", "unshare") if requested == "auto" else (requested,)
    reasons = []
    for level in tried:
        why = level_works(level, python)
        if not why:
            return level
        reasons.append(f"{level}: {why}")
    raise UserError(f"no sandbox works here ({'; '.join(reasons)}): install bubblewrap (Debian: apt install "
                    "bubblewrap) or allow user namespaces; sandbox = \"none\" runs untrusted code without isolation")


class LocalSandbox:
    """Runs solutions in the chosen level on this machine, at most `max_concurrency` at once."""

    def __init__(self, level: str = "auto", limits: Limits | None = None, max_concurrency: int = 4,
                 python: str = sys.executable):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise UserError(f"sandbox max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        self.level = choose_level(level, python)
        self.limits = limits or Limits()
        self.python = python
        self._limit = LoopLimit(max_concurrency)
        if self.level == "none":
            logger.warning("sandbox = \"none\": generated code runs WITHOUT isolation (only rlimits, a temporary "
                           "directory and a stripped environment): it can read and write what this user can")
        else:
            logger.info(f"code sandbox: {self.level}")

    async def run(self, solution: str, cases: Sequence[dict[str, Any]]) -> AsyncIterator[CaseResult]:
        """One `CaseResult` per case, in order, as the harness finishes them; stopping the iteration early (the
        caller's `break`) kills the harness. A harness that dies or says nothing valid: `SandboxFailed`."""
        async with self._limit():
            with _SLOTS.take() as slot, tempfile.TemporaryDirectory(prefix="prime-rl-sandbox-") as tmp:
                workdir = workdir_for(self.level, self.python, tmp)
                job = encode_job(self.level, slot, workdir, solution, cases, self.limits, self.python)
                proc = await asyncio.create_subprocess_exec(
                    *harness_argv(self.level, self.python, self.limits), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=sandbox_env(workdir),
                    cwd=tmp, start_new_session=True,
                    limit=self.limits.line_bytes)
                finished = False
                try:
                    async for result in self._results(proc, job, len(cases)):
                        yield result
                    finished = True
                finally:
                    await self._end(proc, wait_s=2.0 if finished else 0.0)

    @staticmethod
    async def _end(proc: asyncio.subprocess.Process, wait_s: float) -> None:
        """A harness that gave every result exits by itself (its own reaping done: no process is left, not even a
        zombie); one stopped early, hung or past `wait_s` is killed with its process group."""
        if wait_s:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), wait_s)
        if proc.returncode is None:
            signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()

    async def _results(self, proc: asyncio.subprocess.Process, job: bytes, cases: int) -> AsyncIterator[CaseResult]:
        assert proc.stdin and proc.stdout and proc.stderr
        stderr_task = asyncio.ensure_future(proc.stderr.read(1 << 16))
        try:
            proc.stdin.write(job)
            await proc.stdin.drain()
            proc.stdin.close()
            deadline = self.limits.evaluation_deadline(cases)
            loop = asyncio.get_running_loop()
            end = loop.time() + deadline
            for _ in range(cases):
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, end - loop.time()))
                except TimeoutError:
                    raise SandboxFailed(f"the sandbox gave no result within {deadline:.0f} s") from None
                except ValueError:  # a line past the cap: cannot come from the harness's own limits
                    raise SandboxFailed("the sandbox wrote a line past its output cap") from None
                if not line:
                    await proc.wait()
                    why = (await stderr_task).decode("utf-8", "replace").strip().splitlines()
                    raise SandboxFailed(f"the sandbox exited ({proc.returncode}) before every case had a result"
                                        + (f": {why[-1][:300]}" if why else ""))
                yield CaseResult.from_json(json.loads(line))
        finally:
            stderr_task.cancel()

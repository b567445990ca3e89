"""Which run directory `rl` may start in, and what `--overwrite` may delete.

`rl` marks a directory it runs in with the file `<output_dir>/.prime-rl-run` (written when
a run starts, fresh or resumed). The marker is the only proof that the run artifacts there
(`RUN_ARTIFACTS`) are prime-rl's, so:

- a directory that does not exist, or is empty, starts a fresh run;
- a directory that holds run artifacts needs `--ckpt.resume-step` (continue; checkpoints are
  what resume needs, so run directories made before the marker existed resume too) or
  `--overwrite` (start over), unless it is a marked run that trained no step (it failed to start or
  was stopped before its first step): that one is replaced as `--overwrite` would;
- `--overwrite` deletes exactly `RUN_ARTIFACTS`, leftovers of interrupted writes of them
  (`.<name>.<random>.tmp`) and the marker, and keeps every other file. It refuses a directory
  that holds files but no marker (a folder prime-rl did not make, or a run from before the
  marker: delete that one yourself);
- other files beside a fresh run are left alone.

`plan` only looks; `rl` calls it with every other check before it deletes anything.

The `rl` running in a directory holds its run lock exclusively (`run_lock.py`), taken (`prepare_run_dir`)
before it deletes or writes anything and held until it ends: a second `rl` there (`--overwrite` or a resume
included), or a trainer or orchestrator started there by hand, is refused in one line naming the running one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from prime_rl.run_dir import MARKER, NODES, RUN_ARTIFACTS, RUN_LOCK, SLURM, trained_a_step
from prime_rl.utils.errors import ConfigError
from prime_rl.utils.fs import atomic_write_text


def _some(names: set[str]) -> str:
    shown = sorted(names)
    return ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")


def _leftover_of_ours(name: str) -> bool:
    """A temporary of an interrupted atomic write of one of our files (`fs.atomic_path`: `.<name>.<random>.tmp`)."""
    return name.endswith(".tmp") and any(name.startswith(f".{own}.") for own in (*RUN_ARTIFACTS, MARKER))


def plan(out: Path, overwrite: bool, resuming: bool) -> list[Path]:
    """The paths `--overwrite` will delete (nothing else is deleted); a ConfigError when `out` may not be used.

    Looks only: changes nothing, so every check of a run can happen before any deletion.
    """
    if not out.is_dir():
        return []  # does not exist yet (the config checks already refused a file in its place)
    entries = {entry.name for entry in out.iterdir()}
    if resuming:
        return []
    artifacts = [name for name in RUN_ARTIFACTS if name in entries]
    if not overwrite:
        if not artifacts:
            return []
        if MARKER not in entries or trained_a_step(out):
            raise ConfigError(
                f"output dir {out} already holds a run ({', '.join(artifacts)}); continue it with "
                "--ckpt.resume-step latest, replace it with --overwrite, or pick another --output-dir"
            )
        # A marked run that trained no step (it failed to start, or was stopped before its first step): nothing to
        # keep or resume, so it is replaced as --overwrite would.
    elif MARKER not in entries:
        # only what a server node's rl, `rl --slurm.nodes` or the lock put there
        if not entries - {NODES, SLURM, RUN_LOCK}:
            return []
        raise ConfigError(
            f"--overwrite deletes only what an rl run wrote, and {out} has no {MARKER} marker of one "
            f"(it holds {_some(entries)}); delete it yourself or pick another --output-dir"
        )
    leftovers = sorted(name for name in entries if _leftover_of_ours(name))
    return [out / name for name in (*artifacts, *leftovers, MARKER)]


def check_writable(out: Path) -> None:
    """Create `out` and write a probe file in it: a one-line ConfigError naming the path if that fails."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-probe.", suffix=".tmp"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {(exc.strerror or str(exc)).lower()}") from None


def delete(paths: list[Path]) -> None:
    """Delete what `plan` returned."""
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def mark(out: Path, command: str) -> None:
    """Write the marker: from now on `--overwrite` may delete this directory's run artifacts."""
    record = {"written_by": f"prime-rl {command}", "pid": os.getpid(), "artifacts": list(RUN_ARTIFACTS)}
    atomic_write_text(out / MARKER, json.dumps(record) + "\n")

"""`manifest.json`: the size and SHA-256 of every file of a checkpoint part, and its check.

    {"format": 1, "files": {"<relative posix path>": {"size": <bytes>, "sha256": "<hex>"}, ...}}

The writer lists every file of the (still temporary) directory, hashes them and writes the
manifest last, just before the directory is renamed into place; so every checkpoint part
this version writes has one. Verification compares the directory with it before anything
of the checkpoint is read: a missing, truncated, extended or changed file, an unexpected
extra file, or a missing or unreadable manifest is a one-line `CorruptCheckpoint` naming
the file. Up to 8 files are hashed at once, one thread each (hashlib releases the GIL);
the cost is in docs/architecture.md ("Checksumming checkpoints is cheap").
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from prime_rl.utils.errors import UserError

MANIFEST = "manifest.json"
FORMAT = 1
_CHUNK = 8 << 20
_THREADS = min(8, os.cpu_count() or 1)


class CorruptCheckpoint(UserError):
    """A checkpoint part does not match its manifest (or has none): nothing of it is loaded."""


def list_files(directory: Path) -> list[str]:
    """Sorted relative posix paths of every file under `directory` (dot-files included), the manifest excepted."""
    directory = Path(directory)
    names = (p.relative_to(directory).as_posix() for p in directory.rglob("*") if not p.is_dir())
    return sorted(n for n in names if n != MANIFEST)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _hash_all(directory: Path, names: list[str]) -> dict[str, str]:
    with ThreadPoolExecutor(_THREADS) as pool:
        return dict(zip(names, pool.map(lambda n: sha256_file(directory / n), names), strict=True))


def write_manifest(directory: Path) -> Path:
    """Hash every file of `directory` and write its manifest (call it after the last other file is written)."""
    directory = Path(directory)
    names = list_files(directory)
    digests = _hash_all(directory, names)
    files = {n: {"size": (directory / n).stat().st_size, "sha256": digests[n]} for n in names}
    path = directory / MANIFEST
    path.write_text(json.dumps({"format": FORMAT, "files": files}, indent=1, sort_keys=True))
    return path


def _read_manifest(directory: Path) -> dict[str, dict]:
    path = directory / MANIFEST
    if not path.is_file():
        raise CorruptCheckpoint(f"checkpoint {directory} has no {MANIFEST}: it is damaged or was written by an older "
                                f"prime-rl, whose checkpoints cannot be loaded (their .pt files could run code); "
                                f"delete it to resume from an earlier checkpoint")
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if data.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError(f"unknown format {data.get('format')!r}")
        for name, entry in files.items():
            parts = PurePosixPath(name).parts
            if not parts or name.startswith("/") or ".." in parts or name == MANIFEST:
                raise ValueError(f"file name {name!r} is not inside the checkpoint")
            if isinstance(entry["size"], bool) or not (
                isinstance(entry["size"], int) and isinstance(entry["sha256"], str)
            ):
                raise ValueError(f"bad entry for {name!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptCheckpoint(f"checkpoint manifest {path} is unreadable: {exc}") from None
    return files


def verify_manifest(directory: Path) -> None:
    """Raise `CorruptCheckpoint` naming the first file that differs from `directory`'s manifest.

    Cheap checks first (every listed file present with its size, no unlisted file), then
    the SHA-256 of every file.
    """
    directory = Path(directory)
    try:
        _verify(directory, _read_manifest(directory))
    except OSError as exc:  # a file that cannot be read (permissions, I/O error) is named too
        raise CorruptCheckpoint(f"cannot read checkpoint {directory}: {exc}") from None


def _verify(directory: Path, expected: dict[str, dict]) -> None:
    hint = f"delete {directory} to resume from an earlier checkpoint"
    for name, entry in sorted(expected.items()):
        path = directory / name
        if not path.is_file():
            raise CorruptCheckpoint(f"checkpoint file {path} is missing (listed in {MANIFEST}); {hint}")
        size = path.stat().st_size
        if size != entry["size"]:
            state = "truncated" if size < entry["size"] else "longer than written"
            raise CorruptCheckpoint(f"checkpoint file {path} is {state} ({size} bytes, {entry['size']} written); "
                                    f"{hint}")
    for name in list_files(directory):
        if name not in expected:
            raise CorruptCheckpoint(f"unexpected file {directory / name} in checkpoint (not in {MANIFEST}); "
                                    f"remove it or {hint}")
    names = sorted(expected)
    for name, digest in _hash_all(directory, names).items():
        if digest != expected[name]["sha256"]:
            raise CorruptCheckpoint(f"checkpoint file {directory / name} is corrupted (sha256 mismatch); {hint}")

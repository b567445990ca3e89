"""Weight directories (`weights/step_N/`: HF format, or a LoRA adapter) as both backends accept them.

A directory is accepted only under an allowed root (`AccessPolicy.weight_roots`: the config's
`weight_dirs` and the served model's own directory), judged after resolving symlinks and
`..`, so a link or a relative path cannot lead outside. The root check comes before any
look at the path, so a refused path reveals nothing about what exists there. The same
holds for every file read from it (`config.json`, `*.safetensors`): a file that is a link
leading outside the roots is refused too, and so is anything that is not a regular file
(a FIFO or a device would block the reader forever).

Every file is opened once, and judged and read through that one descriptor, never by its
name again (`open_weight_file`), so renaming files or directories between the check and the
read cannot redirect a read:

- the name is resolved (`os.path.realpath`) and must lie under a root (else 403, before it is
  opened; a name that changes while it is resolved, a link when `lstat` looks and a file when
  `readlink` reads it, is 400 like any unreadable path); a link that resolves inside the roots
  is followed this once: its target is opened
  with `O_NOFOLLOW` (a name that became a link meanwhile fails to open: 400) and `O_NONBLOCK`
  (a FIFO opens without waiting for a writer);
- the open descriptor must be a regular file (`fstat`, else 400) that really lies under a root
  (else 403): its path as the kernel names it (`/proc/self/fd/N`), so a directory of the path
  swapped for a link meanwhile is caught; without /proc, the resolved name must still be the
  same file (`st_dev`, `st_ino`), else 400;
- readers (`weight_check`, `adapter_check`, the builtin engine, the vLLM middleware) take a
  `WeightDir` (`open_update_dir` for an update: the files of the directory, open) and read
  `config.json` and the tensors through its descriptors (`WeightFile`).

A hard link is the file itself: roots are judged by path, so a hard link inside a root to a
file elsewhere counts as inside (as it always did).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from prime_rl.models.lora_adapter import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from prime_rl.run_dir import TRANSFER_MARKER
from prime_rl.utils.errors import UserError
from prime_rl.utils.fs import step_number

if TYPE_CHECKING:
    import torch

CONFIG = "config.json"
PROC_FD = Path("/proc/self/fd")  # the kernel's link to each open descriptor's file (Linux)
COPY_CHUNK = 1 << 24  # bytes per read when a file is copied through its descriptor


class WeightPathForbidden(UserError):
    """A weight path outside every allowed root (HTTP 403)."""


def _forbidden(path: str | Path, roots: Sequence[Path]) -> WeightPathForbidden:
    allowed = ", ".join(str(root) for root in roots)
    return WeightPathForbidden(f"weight path {path} is outside the allowed weight directories ({allowed})")


def _under(real: Path, roots: Sequence[Path]) -> bool:
    return any(real == root or real.is_relative_to(root) for root in roots)


def _resolved(path: str | Path) -> Path:
    """`path` with every symlink and `..` resolved (`os.path.realpath`), or UserError: a name that is not a path
    (an embedded NUL byte, too long) or that changed while it was resolved (a link when `lstat` looked, a file when
    `readlink` read it: EINVAL) is refused like any other unreadable weight path, never raised as an OSError."""
    try:
        return Path(os.path.realpath(path))
    except ValueError as exc:
        raise UserError(f"invalid weight path: {exc}") from None
    except OSError as exc:
        raise UserError(f"cannot read weight path {path}: {exc.strerror}") from None


def resolve_allowed(path: str | Path, roots: Sequence[Path]) -> Path:
    """`path` resolved after symlinks (`_resolved`), if that is one of `roots` or below one; else
    WeightPathForbidden."""
    real = _resolved(path)
    if not roots:
        raise WeightPathForbidden(
            "this server loads no weight updates: no weight directory is allowed (start it with --weight-dirs)")
    if not _under(real, roots):
        raise _forbidden(path, roots)
    return real


class WeightFile:
    """One weight file, open (`open_weight_file`): `path` is the name it was opened by (for messages); every read
    goes through the descriptor, so a rename after the open changes nothing that is read."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._file = open(fd, "rb", buffering=0)  # noqa: SIM115 (owns the descriptor: closed by close(), or when collected)

    @property
    def fd(self) -> int:
        return self._file.fileno()

    def identity(self) -> tuple[int, int]:
        """(st_dev, st_ino): which file this is, whatever names it has now."""
        st = os.fstat(self.fd)
        return st.st_dev, st.st_ino

    def real_path(self) -> Path:
        """Where the open file lies: the kernel's path of the descriptor (/proc/self/fd); without /proc the name
        resolved now, which must still be this file (else UserError)."""
        if PROC_FD.is_dir():
            return Path(os.readlink(PROC_FD / str(self.fd)))
        real = _resolved(self.path)
        try:
            same = os.stat(real)
        except OSError as exc:
            raise UserError(f"cannot read weight file {self.path}: {exc.strerror}") from None
        if (same.st_dev, same.st_ino) != self.identity():
            raise UserError(f"weight file {self.path} was replaced while it was opened")
        return real

    def read_bytes(self, size: int | None = None, offset: int = 0) -> bytes:
        """`size` bytes from `offset` (None: to the end), read through the descriptor (never its file offset)."""
        end = os.fstat(self.fd).st_size if size is None else offset + size
        chunks = []
        while offset < end:
            chunk = os.pread(self.fd, min(end - offset, COPY_CHUNK), offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks)

    def specs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Name -> (shape, safetensors dtype: F32, BF16, ...) of every tensor in the safetensors header (no data
        read). Corrupt files raise safetensors' or json's own errors."""
        if PROC_FD.is_dir():
            with self._safe_open() as handle:
                return {name: (tuple(handle.get_slice(name).get_shape()), handle.get_slice(name).get_dtype())
                        for name in handle.keys()}  # noqa: SIM118 (safe_open handles are not iterable)
        size = int.from_bytes(self.read_bytes(8), "little")
        header = json.loads(self.read_bytes(size, 8))
        return {name: (tuple(entry["shape"]), entry["dtype"]) for name, entry in header.items()
                if name != "__metadata__"}

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of every tensor in the file. With /proc: `safe_open` on /proc/self/fd/N, which is this
        descriptor's file whatever its name is now (mmapped, one tensor read at a time). Without: the file is read
        whole through the descriptor (memory: the file's size, on top of the tensors taken from it)."""
        if PROC_FD.is_dir():
            with self._safe_open() as handle:
                for name in handle.keys():  # noqa: SIM118
                    yield name, handle.get_tensor(name)
            return
        from safetensors.torch import load

        yield from load(self.read_bytes()).items()

    def _safe_open(self):
        from safetensors import safe_open

        return safe_open(str(PROC_FD / str(self.fd)), framework="pt", device="cpu")

    def copy_to(self, target: Path) -> None:
        """Write the file's bytes, read through the descriptor a chunk at a time, to a new file `target`."""
        with open(target, "xb") as out:
            offset = 0
            while chunk := os.pread(self.fd, COPY_CHUNK, offset):
                out.write(chunk)
                offset += len(chunk)

    def close(self) -> None:
        self._file.close()


def open_weight_file(path: str | Path, roots: Sequence[Path] | None = None,
                     identity: tuple[int, int] | None = None) -> WeightFile:
    """Open the weight file `path` once and check the open file (module docstring): a regular file (else
    UserError); with `roots`, one under a root (else WeightPathForbidden: judged on the resolved name before it is
    opened, then on the descriptor's real path); with `identity` ((st_dev, st_ino) of a file checked elsewhere and
    still held open there, so its inode cannot be reused), that very file (else UserError). Without `roots` (a
    trusted local directory: the served model's) links are followed."""
    path = Path(path)
    target, flags = path, os.O_RDONLY | os.O_NONBLOCK
    if roots is not None:
        target, flags = resolve_allowed(path, roots), flags | os.O_NOFOLLOW
    try:
        fd = os.open(target, flags)
    except OSError as exc:
        raise UserError(f"cannot read weight file {path}: {exc.strerror}") from None
    file = WeightFile(path, fd)
    try:
        if roots is not None and not _under(file.real_path(), roots):
            raise _forbidden(path, roots)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"weight file {path} is not a regular file")
        if identity is not None and file.identity() != tuple(identity):
            raise UserError(f"weight file {path} is not the file that was checked: it was replaced")
    except BaseException:
        file.close()
        raise
    return file


class WeightDir:
    """A weight directory with its files open: `path` (as opened; an update's is resolved), `files` by name,
    `step` (an update's). Readers read `files`, never `path`. A context manager: leaving it closes the files."""

    def __init__(self, path: Path, files: dict[str, WeightFile], step: int | None = None):
        self.path, self.files, self.step = path, files, step

    @property
    def is_marker(self) -> bool:
        """The weights came over the transfer group (`transfer.json`; inference/transfer.py)."""
        return TRANSFER_MARKER in self.files

    @property
    def is_adapter(self) -> bool:
        """A LoRA adapter (`adapter_config.json`; inference/adapter_check.py)."""
        return ADAPTER_CONFIG in self.files

    def file(self, name: str) -> WeightFile:
        if name not in self.files:
            raise UserError(f"cannot read {self.path / name}: no such weight file")
        return self.files[name]

    def _tensor_items(self) -> list[tuple[str, WeightFile]]:
        """(name, file) of the `*.safetensors` files, sorted by name: the one listing of a directory's tensors."""
        found = [(name, file) for name, file in sorted(self.files.items()) if name.endswith(".safetensors")]
        if not found:
            raise UserError(f"no *.safetensors files in {self.path}")
        return found

    @property
    def tensor_files(self) -> list[WeightFile]:
        return [file for _, file in self._tensor_items()]

    def pins(self) -> list[tuple[str, str, int, int]]:
        """(name, real path, st_dev, st_ino) of each tensor file: what another process of this host needs to open
        the very files checked here while they are held open (`open_pinned`)."""
        return [(name, str(file.real_path()), *file.identity()) for name, file in self._tensor_items()]

    def private_copy(self) -> Path:
        """A new directory only this user can read (`tempfile.mkdtemp`, mode 0700) holding a copy of every file,
        made through the descriptors: for a reader that takes only a path (vLLM's LoRA loader). The caller removes
        it."""
        directory = Path(tempfile.mkdtemp(prefix="prime-rl-weights-"))
        try:
            for name, file in self.files.items():
                file.copy_to(directory / name)
        except BaseException:  # a full disk: no half copy is left behind
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return directory

    def close(self) -> None:
        for file in self.files.values():
            file.close()

    def __enter__(self) -> WeightDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_all(directory: Path, opens: list[tuple[str, Path, tuple[int, int] | None]],
              roots: Sequence[Path] | None) -> WeightDir:
    """A WeightDir of `opens` ((name, path, identity) each, opened by `open_weight_file`); all closed again if one
    fails."""
    weights = WeightDir(directory, {})
    try:
        for name, path, identity in opens:
            weights.files[name] = open_weight_file(path, roots, identity)
    except BaseException:
        weights.close()
        raise
    return weights


def open_weight_dir(path: str | Path, roots: Sequence[Path] | None = None) -> WeightDir:
    """`path`'s weight files, open. With `roots` (an update, see `open_update_dir`) the directory must resolve
    under one (else WeightPathForbidden, judged before anything about it is looked at), exist and hold
    `config.json` and `*.safetensors` (full weights), `adapter_config.json` and `adapter_model.safetensors` (a
    LoRA adapter), or `transfer.json` (a marker: the weights came over the transfer group), only those are opened,
    each by `open_weight_file` with the roots. Without `roots` (a trusted local directory: the served model's)
    whichever of `config.json`, `adapter_config.json` and `*.safetensors` exist are opened, following links.
    Other problems raise `UserError`."""
    directory = resolve_allowed(path, roots) if roots is not None else Path(path)
    try:
        if not directory.exists():
            raise UserError(f"weight path {path} does not exist")
        if not directory.is_dir():
            raise UserError(f"weight path {path} is not a directory")
        tensors = sorted(file.name for file in directory.glob("*.safetensors"))
        if roots is None:
            names = [name for name in (CONFIG, ADAPTER_CONFIG) if os.path.lexists(directory / name)]
            names += [name for name in tensors if name not in names]
        elif os.path.lexists(directory / TRANSFER_MARKER):
            names = [TRANSFER_MARKER]
        elif os.path.lexists(directory / ADAPTER_CONFIG):
            names = [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
            for name in names:
                if not os.path.lexists(directory / name):
                    raise UserError(f"weight path {path} is an adapter directory without {name}")
        else:
            if not os.path.lexists(directory / CONFIG) or not tensors:
                raise UserError(f"weight path {path} is not a weight directory (needs config.json and "
                                f"*.safetensors, or {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
            names = [CONFIG, *tensors]
    except OSError as exc:
        raise UserError(f"cannot read weight path {path}: {exc.strerror}") from None
    return _open_all(directory, [(name, directory / name, None) for name in names], roots)


def open_update_dir(path: str | Path, step: int | None, roots: Sequence[Path]) -> WeightDir:
    """An update's directory, open and checked (`open_weight_dir` with `roots`), with its weight step: `step` when
    given, else parsed from the resolved directory's name `step_N`."""
    weights = open_weight_dir(path, roots)
    try:
        if step is None:
            step = step_number(weights.path.name)
            if step is None:
                raise UserError(f"cannot tell the weight step of {path}: name it step_N or pass 'step'")
        if step < 0:
            raise UserError(f"weight step must be >= 0 (got {step})")
    except BaseException:
        weights.close()
        raise
    weights.step = step
    return weights


def open_pinned(path: str | Path, pins: Sequence[Sequence]) -> WeightDir:
    """The tensor files another process checked and holds open (`WeightDir.pins`), opened again by their real paths
    and each refused unless it is that very file; all are opened before anything is read."""
    opens = [(str(name), Path(real), (int(dev), int(ino))) for name, real, dev, ino in pins]
    return _open_all(Path(path), opens, None)


@contextmanager
def opened(source: WeightDir | str | Path) -> Iterator[WeightDir]:
    """`source` itself when it is open; a path (a trusted local directory: the served model's, a test's) is
    opened here (`open_weight_dir` without roots) and closed after."""
    if isinstance(source, WeightDir):
        yield source
        return
    with open_weight_dir(source) as weights:
        yield weights

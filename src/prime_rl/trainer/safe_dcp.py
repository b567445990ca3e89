"""`torch.distributed.checkpoint.load` without running code from the checkpoint.

Stock DCP unpickles `.metadata` with `pickle.load` and every non-tensor value (the
optimizer's param_groups entries) with `torch.load(weights_only=False)`: a checkpoint
someone else supplied could run code on load. Here `.metadata` is unpickled with an
allow-list of DCP's own metadata classes (plus torch.Size, dtypes, layouts and paths),
its file references must be plain file names inside the checkpoint directory, and
non-tensor values load with `torch.load(weights_only=True)`; anything else raises, and
`LOAD_FAILURES` / `one_line_reason` let the caller turn it into one line.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "TensorProperties", "StorageMeta", "MetadataIndex",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals DCP's metadata is made of; refuses any other."""

    def find_class(self, module: str, name: str):
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANTS):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def read_metadata(directory: Path) -> Metadata:
    """`directory/.metadata` through `_MetadataUnpickler`, its file references checked."""
    with open(Path(directory) / ".metadata", "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f".metadata holds a {type(metadata).__name__}, not DCP Metadata")
    for info in (metadata.storage_data or {}).values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise pickle.UnpicklingError(f".metadata refers to {name!r}, not a file of the checkpoint")
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


class SafeReader(FileSystemReader):
    """A `FileSystemReader` whose metadata is read (once, on construction, so a refusal raises here
    and not inside DCP, which would log tracebacks and fall back to rank-local files) by `read_metadata`."""

    def __init__(self, directory: Path):
        super().__init__(str(directory))
        self._metadata = read_metadata(directory)

    def read_metadata(self, *args, **kwargs) -> Metadata:
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """Non-tensor values (floats, tuples, names of the optimizer's param_groups) load with weights_only=True."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:  # as DefaultLoadPlanner.load_bytes, which uses weights_only=False
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load(state: dict, directory: Path) -> None:
    """`dcp.load(state)` from `directory` (collective), with the restrictions above."""
    dcp.load(state, storage_reader=SafeReader(directory), planner=SafeLoadPlanner())


LOAD_FAILURES = (Exception, CheckpointException)
"""What a damaged or foreign checkpoint can raise inside DCP (`CheckpointException` is a BaseException)."""


def one_line_reason(exc: BaseException) -> str:
    """`Type: first line` of an exception, unwrapping DCP's per-rank `CheckpointException`."""
    if isinstance(exc, CheckpointException) and exc.failures:
        failure = next(iter(exc.failures.values()))
        exc = failure[0] if isinstance(failure, tuple) else failure
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}".rstrip(": ")

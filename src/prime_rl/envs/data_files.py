"""Rows of a data set: a local JSONL, JSON, CSV or parquet file, a directory of them, a directory written by
`datasets.save_to_disk`, or a Hugging Face `datasets` name found in the local cache.

`load_rows(source, split)` returns the rows as dicts, in file order, with `RowRef`s saying where each came
from (`file:line` for JSONL, `file row N` otherwise) so that a bad row is named in one line. Formats:

- `.jsonl`: one JSON object per line (blank lines skipped); `.json`: a list of objects;
- `.csv`: a header line, every value a string; `.parquet`: read with pyarrow;
- a directory: a `datasets.save_to_disk` directory (a `DatasetDict` gives `split`), else every supported
  file under it whose name contains `split` (`train.jsonl`, `data/train-00000-of-00002.parquet`), or all of
  them for `split = "train"` when no name does, in sorted path order;
- anything else is a data set name for `datasets.load_dataset(name, split=split)`, offline: it must already
  be in the local Hugging Face cache (nothing is downloaded at run time).
"""

from __future__ import annotations

import csv
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prime_rl.utils.errors import UserError

FORMATS = (".jsonl", ".json", ".csv", ".parquet")


@dataclass(frozen=True)
class RowRef:
    """Where a row came from, for error messages."""

    file: str
    number: int  # 1-based: the line of a JSONL file, else the row
    unit: str = "row"

    def __str__(self) -> str:
        return f"{self.file}:{self.number}" if self.unit == "line" else f"{self.file} row {self.number}"


def load_rows(source: str | Path, split: str = "train") -> list[tuple[dict[str, Any], RowRef]]:
    """Every row of `source`'s `split` with where it came from (module docstring); a one-line UserError for a
    source that cannot be read or holds no rows. A local file read again unchanged (the config check, then the
    orchestrator's sources) is read once per process: callers must not change the rows."""
    path = Path(source).expanduser()
    if path.is_file():
        stat = path.stat()
        return _read_file_once(str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    return _load_rows(source, path, split)


@functools.lru_cache(maxsize=8)
def _read_file_once(path: str, mtime_ns: int, size: int) -> list[tuple[dict[str, Any], RowRef]]:
    return _load_rows(path, Path(path), "train")


def _load_rows(source: str | Path, path: Path, split: str) -> list[tuple[dict[str, Any], RowRef]]:
    if path.is_file():
        rows = _read_file(path)
    elif path.is_dir():
        rows = _read_dir(path, split)
    else:
        rows = _read_hub(str(source), split)
    if not rows:
        raise UserError(f"data set {source} (split {split!r}) has no rows")
    return rows


def _read_file(path: Path) -> list[tuple[dict[str, Any], RowRef]]:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise UserError(f"data file {path}: unknown format {suffix or '(no suffix)'} (use {', '.join(FORMATS)})")
    try:
        if suffix == ".jsonl":
            return _read_jsonl(path)
        if suffix == ".json":
            records = json.loads(path.read_text())
            if not isinstance(records, list):
                raise UserError(f"data file {path}: a .json file must hold a list of objects")
            return _objects(records, path)
        if suffix == ".csv":
            with path.open(newline="") as f:
                return [(dict(row), RowRef(str(path), i)) for i, row in enumerate(csv.DictReader(f), start=1)]
        import pyarrow.parquet as pq

        return _objects(pq.read_table(path).to_pylist(), path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError and pyarrow's errors included
        raise UserError(f"data file {path}: cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None


def _read_jsonl(path: Path) -> list[tuple[dict[str, Any], RowRef]]:
    rows = []
    with path.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise UserError(f"{path}:{number}: a row must be a JSON object, not a {type(record).__name__}")
            rows.append((record, RowRef(str(path), number, "line")))
    return rows


def _objects(records: list, path: Path) -> list[tuple[dict[str, Any], RowRef]]:
    for i, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise UserError(f"data file {path} row {i}: a row must be an object, not a {type(record).__name__}")
    return [(record, RowRef(str(path), i)) for i, record in enumerate(records, start=1)]


def _read_dir(path: Path, split: str) -> list[tuple[dict[str, Any], RowRef]]:
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        import datasets

        data = datasets.load_from_disk(str(path))
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise UserError(f"data set {path} has no split {split!r} (splits: {', '.join(data)})")
            data = data[split]
        return [(dict(row), RowRef(str(path), i)) for i, row in enumerate(data, start=1)]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in FORMATS)
    chosen = [p for p in files if split in p.name]
    if not chosen and split == "train":
        chosen = files
    if not chosen:
        raise UserError(f"data directory {path} has no {'/'.join(FORMATS)} file named for split {split!r}")
    return [row for p in chosen for row in _read_file(p)]


def _read_hub(name: str, split: str) -> list[tuple[dict[str, Any], RowRef]]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # no network at run time: the local cache or nothing
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as exc:  # datasets raises many types (ConnectionError offline, ValueError, FileNotFoundError)
        raise UserError(f"data set {name!r} is no local file or directory and cannot be loaded from the local "
                        f"Hugging Face cache (nothing is downloaded at run time; save it with "
                        f"datasets' save_to_disk and give that path): {type(exc).__name__}: {str(exc)[:150]}") from None
    return [(dict(row), RowRef(name, i)) for i, row in enumerate(data, start=1)]

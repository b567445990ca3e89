"""Read a W&B offline run (`outputs/<run>/wandb/offline-run-*/run-*.wandb`) without W&B's service or an account:
its config, its summary and every logged row. wandb 0.31 keeps no readable config or summary file beside an
offline run; this reads them from the run file itself.

    uv run python -m prime_rl.monitor.wandb_offline outputs/reverse_text    # a run dir, its wandb/ or a .wandb file

prints the config, the summary (the last value of every key) and how many rows were logged, as JSON; `tables`
reads the tables logged under a key (the orchestrator's `samples`: [orchestrator.samples] wandb_interval).

The file is a 7-byte header (":W&B", magic, version) followed by a LevelDB-style log:
32 KiB blocks of chunks, each `crc32c (4) | length (2, little-endian) | type (1) | data`,
type 1 = full record, 2/3/4 = first/middle/last piece. Each record is a protobuf
`wandb_internal_pb2.Record`; history records hold one logged row as key -> JSON value.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

HEADER_LEN = 7
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    out, pending, pos = [], b"", HEADER_LEN
    while pos + CHUNK_HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK_HEADER:  # block trailer padding
            pos += room
            continue
        _, length, kind = struct.unpack_from("<IHB", data, pos)
        if pos + CHUNK_HEADER + length > len(data):  # a chunk still being written
            break
        chunk = data[pos + CHUNK_HEADER: pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
        else:  # zero padding at the end of a block
            pos += room - CHUNK_HEADER - length
    return out


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_run(run_file: Path) -> dict:
    """{"config": ..., "summary": ..., "history": [rows]} of an offline run file, values decoded from JSON (config
    and summary updates applied in order)."""
    from wandb.proto import wandb_internal_pb2 as pb

    run = {"config": {}, "summary": {}, "history": []}
    for raw in records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            run["history"].append(_items(record.history.item))
        elif kind == "run":  # the run's first record holds its config
            run["config"].update(_items(record.run.config.update))
        elif kind in ("config", "summary"):
            run[kind].update(_items(getattr(record, kind).update))
    run["config"].pop("_wandb", None)
    return run


def history(run_file: Path) -> list[dict]:
    """Every logged history row of an offline run, values decoded from JSON."""
    return read_run(run_file)["history"]


def tables(run_file: Path, key: str) -> list[dict]:
    """Every table logged under `key` ({"step", "columns", "data"}), read from the run's `files/` folder, where W&B
    keeps a table's JSON; its history row holds `<key>/_type` "table-file" and `<key>/path`."""
    found = []
    for row in history(run_file):
        if row.get(f"{key}/_type") == "table-file":
            table = json.loads((run_file.parent / "files" / row[f"{key}/path"]).read_text())
            found.append({"step": row.get("_step"), "columns": table["columns"], "data": table["data"]})
    return found


def run_files(path: Path) -> list[Path]:
    """The offline run files of a run directory, its `wandb/` folder, or the file itself, oldest first."""
    path = Path(path)
    if path.is_file():
        return [path]
    root = path / "wandb" if (path / "wandb").is_dir() else path
    return sorted(root.glob("offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime)


def main(argv: list[str] | None = None) -> None:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m prime_rl.monitor.wandb_offline <run dir | wandb dir | run-*.wandb>", file=sys.stderr)
        raise SystemExit(2)
    files = run_files(Path(args[0]))
    if not files:
        print(f"error: no W&B offline run under {args[0]} (wandb.mode = 'offline' writes one)", file=sys.stderr)
        raise SystemExit(2)
    for file in files:
        run = read_run(file)
        summary = {k: v for k, v in run["summary"].items() if not k.startswith("_")} or \
            (run["history"][-1] if run["history"] else {})
        print(json.dumps({"file": str(file), "config": run["config"], "summary": summary,
                          "rows": len(run["history"])}, indent=1, default=str))


if __name__ == "__main__":
    main()

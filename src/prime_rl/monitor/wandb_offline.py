"""Read a W&B offline run (`outputs/<run>/wandb/offline-run-*/run-*.wandb`) without W&B's service or an account:
its config, its summary and every logged row. wandb 0.31 keeps no readable config or summary file beside an
offline run; this reads them from the run file itself.

    uv run python -m prime_rl.monitor.wandb_offline outputs/reverse_text    # a run dir, its wandb/ or a .wandb file

prints the config, the summary (the last value of every key), how many rows were logged and whether the file is
complete, as JSON; `tables` reads the tables logged under a key (the orchestrator's `samples`:
[orchestrator.samples] wandb_interval).

W&B's service buffers the file in 32 KiB blocks and writes the last block when the run's stream closes, which it
does on its own time after `run.finish()` returns (or at the process's exit): `wait_complete` waits for the run's
exit record, the last one written.

The file is a 7-byte header (":W&B", magic, version) followed by a LevelDB-style log:
32 KiB blocks of chunks, each `crc32 (4) | length (2, little-endian) | type (1) | data`,
type 1 = full record, 2/3/4 = first/middle/last piece. Each record is a protobuf
`wandb_internal_pb2.Record`; history records hold one logged row as key -> JSON value.
"""

from __future__ import annotations

import json
import struct
import time
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


def parsed(run_file: Path) -> list[tuple[str, object]]:
    """(kind, record) of every whole record: kind is the protobuf `Record`'s record_type ("run", "history", ...)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for raw in records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        out.append((record.WhichOneof("record_type"), record))
    return out


def wait_complete(run_file: Path, timeout_s: float = 60.0) -> bool:
    """Whether the run's exit record reached the file within `timeout_s` (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while not read_run(run_file)["complete"]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_run(run_file: Path) -> dict:
    """{"name", "config", "summary", "history": [rows], "complete": bool} of an offline run file, values decoded
    from JSON (config and summary updates applied in order); complete once the run's exit record is on disk."""
    run = {"name": None, "config": {}, "summary": {}, "history": [], "complete": False}
    for kind, record in parsed(run_file):
        run["complete"] |= kind == "exit"
        if kind == "history":
            run["history"].append(_items(record.history.item))
        elif kind == "run":  # the run's first record holds its name and config
            run["name"] = record.run.display_name
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
        print(json.dumps({"file": str(file), "name": run["name"], "config": run["config"], "summary": summary,
                          "rows": len(run["history"]), "complete": run["complete"]}, indent=1, default=str))


if __name__ == "__main__":
    main()

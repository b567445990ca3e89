"""Read the history of a W&B offline run (`run-*.wandb`) without W&B's service, for tests.

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


def history(run_file: Path) -> list[dict]:
    """Every logged history row of an offline run, values decoded from JSON."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for raw in records(run_file):
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows

"""Read an offline W&B run back: the .wandb file is a LevelDB-style log of protobuf
records (7-byte header ":W&B" + magic + version; 32 KiB blocks; each record chunk has a
CRC32C, a little-endian length and a type FULL/FIRST/MIDDLE/LAST)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7


def _chunks(data: bytes):
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left  # block trailer
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            pos += left  # zero padding to the end of the block
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk
            parts = b""


def read_run(path: Path) -> dict:
    """{'run': the run record, 'history': [dict per logged row], 'summary': {key: value}}."""
    from wandb.proto import wandb_internal_pb2

    out = {"run": None, "history": [], "summary": {}}
    for raw in _chunks(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
        elif kind == "history":
            out["history"].append(
                {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in record.history.item
                }
            )
        elif kind == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out

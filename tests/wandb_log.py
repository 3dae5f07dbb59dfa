"""Read an offline W&B run back: the .wandb file is a LevelDB-style log of protobuf
records (7-byte header ":W&B" + magic + version; 32 KiB blocks; each record chunk has a
CRC32C, a little-endian length and a type FULL/FIRST/MIDDLE/LAST)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK, HEADER = 32768, 7
WRITE_WAIT_S = 20.0  # bound on the wait for W&B's service to finish writing a run's log


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


def records(path: Path):
    """The protobuf records of a .wandb log, in order."""
    from wandb.proto import wandb_internal_pb2

    for raw in _chunks(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        yield record


def complete(path: Path) -> Path:
    """`path` once its exit record is written: wandb 0.31's service may still be writing the
    log after run.finish() returns (seen holding only its 7-byte header), and a test that
    reads it then sees an empty run. Waits at most WRITE_WAIT_S."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + WRITE_WAIT_S
    while time.monotonic() < deadline:
        try:
            if any(r.WhichOneof("record_type") == "exit" for r in records(path)):
                return path
        except (AssertionError, DecodeError):  # caught mid-write
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} has no exit record after {WRITE_WAIT_S} s")


def run_file(run_dir: Path) -> Path:
    """The complete .wandb log of the one offline run under `run_dir`."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/*.wandb")
    return complete(path)


def read_run(path: Path) -> dict:
    """{'run': the run record, 'history': [dict per logged row], 'summary': {key: value}} of
    a complete .wandb log (waits for its exit record)."""
    out = {"run": None, "history": [], "summary": {}}
    for record in records(complete(path)):
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


def rows(run: dict) -> list[dict]:
    """A read run's history rows as logged, without W&B's own keys (_step, _runtime, ...)."""
    return [{k: v for k, v in h.items() if not k.startswith("_")} for h in run["history"]]

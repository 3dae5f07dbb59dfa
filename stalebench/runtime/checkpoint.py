"""Checkpoints of a run in progress, so a preempted run continues instead of starting over.

A checkpoint is the directory `checkpoint/` of the run directory: `state.pt` (what the
engine needs to go on, the run time and the length of events.jsonl when it was taken) and
one file per θ snapshot taken so far (`snap-00000.pt`, ..., written once each). It is
replaced whole (a new state.pt is renamed over the old), so a kill at any moment leaves
the previous one intact. `config.json` beside it names the config the run was started
with, so that a resume checks it before reading any state. Before a resumed run starts,
events.jsonl is cut back to that length (what happened after the checkpoint is computed
again; the cut lines are kept in `cut-<version>.jsonl`), and the run goes on from there,
on the same time axis.

An engine without a server checkpoints every rank at once, at a round's end where nothing
is in flight (`World.checkpoint`): each rank writes its part, `parts/<version>/rank-<r>.pt`
(its θ, optimizer state, worker, faults, the random generator's state), and once every
part is on disk rank 0 commits the set by writing state.pt, which names it. A kill before
the commit leaves the previous set named; a set is removed once a later one is committed.

A run directory is data, never code: every file of a checkpoint (and the state ranks hand
a spare) is read by torch's weights-only loader (`read`), which rebuilds tensors, plain
data and the classes marked `stored` (every registered part and its config, the helpers
they keep; a torch optimizer is kept as its state_dict) and calls nothing else a file
names. A file that holds anything else, or cannot be read, is refused by name
(`Unreadable`). Files are written whole (`write`: a temporary file renamed over the old),
and a write error (a full disk) names the file.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
from pathlib import Path
from typing import IO, Any

import torch

from stalebench.errors import RunError, write_error
from stalebench.evaluation import Snapshot, Snapshots
from stalebench.metrics.events import EventLog
from stalebench.metrics.summary import write_json
from stalebench.registry import STORED
from stalebench.runtime.archive import CONFIG, DIR, Unreadable, check, config_of, container_fault

EVERY_S = 60.0  # checkpoint_every_s's default in runtime=real (the simulator: none)


def every_s(cfg: Any) -> float:
    """Run seconds between checkpoints: `checkpoint_every_s`, or by default 60 in real
    processes and none in the simulator (a simulated run reruns in seconds; set it to
    checkpoint a long one)."""
    if cfg.checkpoint_every_s is not None:
        return float(cfg.checkpoint_every_s)
    return 0.0 if cfg.runtime == "sim" else EVERY_S


def _safe_types() -> list[type]:
    # and a barrier's random stream (random.Random: its state is a tuple of ints). A torch
    # optimizer is kept as its state_dict (`KeepsOptimizer`): the object holds a
    # defaultdict, which the loader does not rebuild
    return [random.Random, *STORED]


def read(source: Path | IO[bytes], name: str | None = None) -> Any:
    """What a checkpoint file `source` (or a state sent between ranks, as bytes) holds, by
    torch's weights-only loader: tensors, plain data, and the classes `_safe_types` names.
    Nothing a file names is executed; raises `Unreadable`, naming it (`name`, or the path),
    for a file that holds anything else or cannot be read."""
    name = name or str(source)
    start = source.tell() if hasattr(source, "tell") else 0
    try:
        with torch.serialization.safe_globals(_safe_types()):
            return torch.load(source, weights_only=True)
    except Exception as exc:  # why, in the project's words (never torch's advice on it)
        raise Unreadable(f"{name}: not loaded: {_why_unreadable(exc, source, start)}") from None


def _why_unreadable(exc: Exception, source: Path | IO[bytes], start: int) -> str:
    """What is wrong with a file the loader refused, in one line: the global it names, or
    what the file is. torch's own message is not relayed: it may advise loading the file
    with weights_only=False, which runs whatever a file of unknown origin names."""
    text = str(exc)
    refused = re.search(r"GLOBAL (\S+)", text)
    if refused:
        return (
            f"it names {refused.group(1)}, which is not data a checkpoint may hold (tensors, "
            "plain data, and the classes marked with stalebench.registry.stored)"
        )
    fault = container_fault(source, start)
    if fault:
        return fault
    # the weights-only unpickler's own reason, when it gives one, without torch's advice
    reason = re.search(r"WeightsUnpickler error: *\n*(.+)", text)
    return "not a stalebench checkpoint (a torch.save archive the weights-only loader " + (
        f"refuses: {reason.group(1).strip()})" if reason else "cannot read)"
    )


def write(obj: Any, path: Path) -> None:
    """torch.save `obj` to `path` whole (a temporary file, renamed over it): a kill leaves
    the previous file, and a write error (a full disk) is an OSError naming `path`."""
    data = io.BytesIO()
    torch.save(obj, data)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.getbuffer())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(exc, path) from None


def _part_path(run_dir: Path, version: int, rank: int) -> Path:
    return Path(run_dir) / DIR / "parts" / str(version) / f"rank-{rank}.pt"


def save_part(run_dir: Path, version: int, rank: int, part: Any) -> None:
    """Rank `rank`'s part of the checkpoint set at `version` (written whole, then renamed)."""
    path = _part_path(run_dir, version, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write(part, path)


def load_part(run_dir: Path, version: int, rank: int) -> Any:
    """Rank `rank`'s part of the committed set at `version` (read safely: `read`)."""
    path = _part_path(run_dir, version, rank)
    if not path.exists():
        raise RunError(f"resume: the checkpoint at version {version} has no {path}")
    return read(path)


def prune_parts(run_dir: Path, kept: int) -> None:
    """Remove the sets of parts other than the one committed at version `kept`."""
    parts = Path(run_dir) / DIR / "parts"
    for old in parts.iterdir() if parts.exists() else ():
        if old.name != str(kept):
            shutil.rmtree(old, ignore_errors=True)


def load(run_dir: Path, sha: str) -> dict[str, Any] | None:
    """The run directory's last checkpoint if one was taken by a run of the config `sha`,
    else None. The config is checked first (`config.json`), before any state is read;
    state.pt is read safely (`read`: raises `Unreadable` naming a file it refuses)."""
    path = Path(run_dir) / DIR / "state.pt"
    if not path.exists() or config_of(run_dir) != sha:
        return None
    check(path, sha)  # what it says of itself, read without torch (`archive`)
    return read(path)


def verify(run_dir: Path, saved: dict[str, Any]) -> None:
    """Read every file the checkpoint `saved` goes on from — its θ snapshots and, for a set
    of rank parts, each part — safely, before anything of the run directory is changed:
    one that is missing or refused raises (`Unreadable`, naming it)."""
    folder = Path(run_dir) / DIR
    for i in range(saved["snapshots"]):
        read(folder / f"snap-{i:05d}.pt")
    state = saved["state"]
    if isinstance(state, dict) and "parts" in state:
        for rank in state["ranks"]:
            path = _part_path(run_dir, state["parts"], rank)
            if not path.exists():
                raise Unreadable(f"{path}: missing (the checkpoint's set names rank {rank})")
            read(path)


class Checkpoints:
    """Rank 0's checkpoints of the run directory (when one falls due is the world's to say:
    `World.checkpoint_due`, every `every_s(cfg)` run seconds)."""

    def __init__(self, run_dir: Path, events: EventLog, snapshots: Snapshots, sha: str):
        self.dir = Path(run_dir) / DIR
        self.events, self.snapshots, self.sha = events, snapshots, sha
        self.saved_snapshots = len(snapshots.taken)  # those already on disk

    def resume(self, saved: dict[str, Any]) -> None:
        """A run that goes on from the checkpoint `saved`: its θ snapshots back in place."""
        for i in range(saved["snapshots"]):
            self.snapshots.taken.append(Snapshot(**read(self.dir / f"snap-{i:05d}.pt")))
        self.snapshots.next_version, self.snapshots.next_t = saved["snapshot_next"]
        if "snapshot_grid" in saved:
            held, self.snapshots.next_grid, self.snapshots._held_taken = saved["snapshot_grid"]
            self.snapshots.held = Snapshot(**held) if held is not None else None
        self.saved_snapshots = len(self.snapshots.taken)

    def save(self, t: float, version: int, state: dict[str, Any]) -> None:
        """Write the checkpoint at run time `t`: the events up to here, the snapshots not yet
        on disk, then `state` (the engine's) with where events.jsonl ends."""
        if not (self.dir / CONFIG).exists():
            self.dir.mkdir(exist_ok=True)
            write_json(self.dir / CONFIG, {"config_sha": self.sha})
        self.events.emit("system", t, event="checkpoint", version=version)
        self.events.flush()
        for i in range(self.saved_snapshots, len(self.snapshots.taken)):
            snap = self.snapshots.taken[i]
            saved = {"t": snap.t, "version": snap.version, "params": snap.tensor()}
            write(saved, self.dir / f"snap-{i:05d}.pt")
        self.saved_snapshots = len(self.snapshots.taken)
        record = {
            "config_sha": self.sha,  # a resume with another config starts over
            "t": t,
            "version": version,
            "events_bytes": self.events.path.stat().st_size,
            "snapshots": self.saved_snapshots,
            "snapshot_next": (self.snapshots.next_version, self.snapshots.next_t),
            # the simulator's grid (`Snapshots.on_grid`): θ as of the last offer, the next
            # grid time, whether a snapshot shares that copy
            "snapshot_grid": (
                vars(held) if (held := self.snapshots.held) is not None else None,
                self.snapshots.next_grid,
                self.snapshots._held_taken,
            ),
            "state": state,
        }
        write(record, self.dir / "state.pt")


def rewind(run_dir: Path, saved: dict[str, Any]) -> None:
    """Take the run directory back to the checkpoint `saved`: events.jsonl is cut back to
    its length, and what is cut (the events since, which the resumed run computes again)
    is kept apart in checkpoint/cut-<version>.jsonl."""
    path = Path(run_dir) / "events.jsonl"
    with open(path, "rb+") as f:
        f.seek(saved["events_bytes"])
        tail = f.read()
        f.truncate(saved["events_bytes"])
    with open(Path(run_dir) / DIR / f"cut-{saved['version']}.jsonl", "ab") as f:
        f.write(tail)

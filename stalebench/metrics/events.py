"""events.jsonl: append-only, one JSON object per line, flushed as the run goes.

Every event has `kind` and `t` (seconds since the run started, on the run's clock:
`CLOCKS`). Kinds and their fields:
- update: worker, clock, version, lag, loss, compute_s, wait_s, comm_s, clock_gap (a
  cost-only run's without loss, or a gossip node's consensus: `VALUE_FIELDS`)
- eval:   version, split, loss, accuracy (t is when the snapshot was taken)
- worker: worker, event (e.g. stop)
- system: event (start, end, error, ...) and its details
- barrier: worker, event (a barrier's decision, e.g. DSSP's grant) and its details
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import weakref
from pathlib import Path
from typing import Any

from stalebench.errors import write_error

KINDS = ("update", "eval", "worker", "system", "barrier")
# the clock a run's times are on, by its runtime: the simulator's virtual seconds, or the
# real seconds a run of real processes took. Each `t`, and every time summary.json derives
# from them (`run_time_s`, `time_to_target_s`, `throughput_updates_per_s`), is on it
CLOCKS = {"sim": "simulated", "real": "real"}
REQUIRED = {
    "update": ("worker", "clock", "version", "lag", "loss", "compute_s", "wait_s", "comm_s"),
    "eval": ("version", "split", "loss", "accuracy"),
    "worker": ("worker", "event"),
    "system": ("event",),
    "barrier": ("worker", "event"),
}
# the fields an event has only where values are computed: a cost-only run's log
# (sim.numerics=false) leaves them out, whichever engine emits the event
VALUE_FIELDS = {
    "update": ("loss", "consensus", "delta_norm", "wire_error", "weight_gap", "grad_norm"),
    "barrier": ("loss",),  # a dropped push's
}


# the types of an event's values that JSON gives back as they were (a float only finite:
# json.dumps refuses the others); an event of these alone is kept as it is (`EventLog.kept`)
_EXACT = frozenset((str, int, float, bool, type(None)))


# json.dumps(event, allow_nan=False) makes a JSONEncoder a call; one, made once, writes the
# same text (an event a second of a long run's rank 0 is most of its time)
_ENCODE = json.JSONEncoder(allow_nan=False).encode


# the text of an event whose values after its kind are all numbers, by its kind and keys: a
# format that writes each number as repr does, which is what _ENCODE writes for an int or a
# finite float (a long run's events are most of them numbers: its updates)
_NUMBERS: dict[tuple[str, ...], str] = {}


def _numbers_line(event: dict[str, Any]) -> str | None:
    """`event` as _ENCODE writes it, when its kind is a str and every other value an int or
    a finite float (exactly: no bool, no subclass); else None."""
    values = tuple(event.values())
    if type(values[0]) is not str:
        return None
    for v in values[1:]:
        of = type(v)
        if of is not int and (of is not float or v - v != 0.0):  # inf - inf, nan: nan
            return None
    shape = (values[0], *event)
    form = _NUMBERS.get(shape)
    if form is None:
        if not all(type(key) is str for key in event):  # JSON writes other keys as text
            return None
        kind, head, *keys = [_ENCODE(text).replace("%", "%%") for text in shape]
        form = _NUMBERS[shape] = (
            "{" + ", ".join([f"{head}: {kind}", *(f"{k}: %r" for k in keys)]) + "}"
        )
    return form % values[1:]


def _clean(value: Any) -> Any:
    # JSON has no NaN/inf: a diverged loss is written as null, never as invalid JSON.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class EventLog:
    """Appends events to the file; each reaches the disk within `flush_s` seconds (0: at
    once, one write per `emit` or `emit_all`). A process that dies loses at most that
    window. Without `values` (a cost-only run) it leaves out the fields that need them
    (`VALUE_FIELDS`).

    With `keep` (a log that is its file's only writer: the simulator's), a log that starts
    the file also keeps what it writes, as `read_events` would read it back (`kept`: None
    once the file holds anything else), so that the run's end need not parse it again."""

    _open: weakref.WeakSet[EventLog] = weakref.WeakSet()

    def __init__(self, path: Path, flush_s: float = 0.0, values: bool = True, keep: bool = False):
        self.path = Path(path)
        self.without = {} if values else VALUE_FIELDS
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1 if flush_s == 0 else 1 << 16)
        self.flush_s = flush_s
        self._flushed = time.monotonic()
        self.kept: list[dict[str, Any]] | None = [] if keep and self._file.tell() == 0 else None
        EventLog._open.add(self)

    @classmethod
    def flush_all(cls, path: Path | None = None) -> None:
        """Write out what this process's open logs of `path` (None: every one) still hold (a
        run stopped by an exception in the middle of its loop, e.g. the simulator
        interrupted; the process at its end)."""
        for log in list(cls._open):
            if (path is None or log.path == Path(path)) and not log._file.closed:
                log.flush()

    def emit(self, kind: str, t: float, **fields: Any) -> None:
        self.emit_all(kind, t, [fields])

    def emit_all(self, kind: str, t: float, rows: list[dict[str, Any]]) -> None:
        """An event of `kind` at `t` for each of `rows` (its fields), in one write: a round's
        updates, one a worker."""
        without, t = self.without.get(kind, ()), round(t, 6)
        lines = []
        for fields in rows:
            event = {"kind": kind, "t": t, **fields}
            for key in without:
                event.pop(key, None)
            line = _numbers_line(event)
            exact = line is not None  # JSON gives its values back as they are
            if line is None:
                try:
                    line = _ENCODE(event)
                except ValueError:  # NaN or inf somewhere (a diverged loss): written as null
                    line = json.dumps({k: _clean(v) for k, v in event.items()})
                    event = None  # kept as read back
            lines.append(line)
            if self.kept is not None:  # as `read_events` reads the line: the event itself
                # when JSON gives it back as it is, else the line parsed
                if not exact:
                    exact = event is not None and _EXACT.issuperset(map(type, event.values()))
                self.kept.append(event if exact else json.loads(line))
        try:
            self._file.write("\n".join(lines) + "\n")
        except OSError as exc:
            raise self._failed(exc) from None
        if self.flush_s and time.monotonic() - self._flushed > self.flush_s:
            self.flush()

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            raise self._failed(exc) from None
        self._flushed = time.monotonic()

    def close(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            raise self._failed(exc) from None

    def _failed(self, exc: OSError) -> OSError:
        """A write that failed (a full disk): the log is closed — what it still buffered is
        lost, not retried at every flush to come — and every later write raises the same
        error, naming the file."""
        self.kept = None  # what the file holds is no longer what was written
        with contextlib.suppress(OSError):
            self._file.close()  # closes the file even when its last flush fails
        self._file = _Failed(write_error(exc, self.path))
        return self._file.error


class _Failed:
    """An event log's file after a write failed: every write raises that error again."""

    closed = True

    def __init__(self, error: OSError):
        self.error = error

    def write(self, _line: str) -> None:
        raise self.error

    def flush(self) -> None:
        raise self.error

    def close(self) -> None:
        pass


def cut_after_end(path: Path) -> int:
    """A run's events after its `end` event other than its evaluations (and the supervisor's
    `stop`) — written by a rank that had not yet heard the run was over, e.g. a pipeline
    stage still taking the microbatches it had when another was lost — moved to
    `<name>-after-end.jsonl` beside it, so that the run's events end with its end; how many
    were moved. Only the file's tail is parsed: back to the last attempt's end (none when a
    `resume` comes first: that attempt did not end)."""
    p = Path(path)
    if not p.exists():
        return 0
    lines = p.read_text().splitlines(keepends=True)
    after, kept, cut = len(lines), [], []
    while after > 0:
        event = _parsed(lines[after - 1])
        if _is(event, "resume"):
            return 0
        if _is(event, "end"):
            break
        after -= 1
        stays = event.get("kind") == "eval" or _is(event, "stop")
        (kept if stays else cut).insert(0, lines[after])
    if after == 0 or not cut:
        return 0
    with open(p.with_name(f"{p.stem}-after-end.jsonl"), "a") as f:
        f.writelines(cut)
    tmp = p.with_suffix(".cut")
    tmp.write_text("".join(lines[:after] + kept))
    tmp.replace(p)
    return len(cut)


def _parsed(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return {}
    return event if isinstance(event, dict) else {}


def _is(event: dict[str, Any], name: str) -> bool:
    return event.get("kind") == "system" and event.get("event") == name


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events of a file; a torn last line (a killed writer) is skipped."""
    events = []
    p = Path(path)
    if not p.exists():
        return events
    with open(p) as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def schema_errors(event: dict[str, Any], values: bool = True) -> list[str]:
    """What is wrong with one event against the schema above (empty when valid); without
    `values`, of a cost-only run, whose events lack `VALUE_FIELDS`."""
    kind = event.get("kind")
    if kind not in KINDS:
        return [f"unknown kind {kind!r}"]
    errors = [] if isinstance(event.get("t"), (int, float)) else ["t missing or not a number"]
    absent = () if values else VALUE_FIELDS.get(kind, ())
    required = [key for key in REQUIRED[kind] if key not in absent]
    return errors + [f"{kind} event lacks {key!r}" for key in required if key not in event]

"""summary.json and metrics.parquet, computed from the events alone.

A run directory holds room for its summary.json from the start (`hold_room`: a file of
ROOM_BYTES): when the disk fills up mid-run, the run ends `failed` with the error naming
the file it could not write, and the room is given up so that summary.json is still
written (without metrics.parquet when that does not fit).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from stalebench.errors import last_line, write_error
from stalebench.metrics.events import CLOCKS, EventLog, read_events

log = logging.getLogger("stalebench")

ROOM = ".room"  # in the run directory, until the run's summary.json is written
ROOM_BYTES = 256 << 10  # summary.json takes a few kB, a rank's error file a line

STATUSES = ("completed", "diverged", "failed", "timeout", "interrupted", "invalid")
# the CLI's exit code per status (interrupted: 128 + the signal, e.g. 130 for SIGINT, 143
# for SIGTERM; invalid: bad input, refused before any process started)
EXIT_CODES = {"completed": 0, "failed": 1, "invalid": 2, "diverged": 3, "timeout": 4}

# `final_tail` averages the last TAIL_PER-th of a run's held-out evaluations (at least one):
# the end of the curve, not its last snapshot, which one batch's summation order can move
TAIL_PER = 10
EVAL_KEYS = ("loss", "accuracy", "perplexity")
# summary.json's name for `run_time_s` before it said its clock (old run directories)
OLD_RUN_TIME = "wall_time_s"


def summarize(
    events: list[dict[str, Any]],
    meta: dict[str, Any],
    status: str,
    error: str | None,
    target_accuracy: float,
) -> dict[str, Any]:
    updates = [e for e in events if e["kind"] == "update"]
    # the held-out split the headline numbers read: the test split, or the validation split
    # of a run that held one out of its training data (eval.split=val), which never
    # evaluates the test split
    evals = [e for e in events if e["kind"] == "eval"]
    split = "val" if any(e["split"] == "val" for e in evals) else "test"
    tests = sorted((e for e in evals if e["split"] == split), key=lambda e: (e["t"], e["version"]))
    end = [e for e in events if e["kind"] == "system" and e["event"] == "end"]
    length = end[-1]["t"] if end else max((e["t"] for e in updates), default=0.0)
    lags = np.array([e["lag"] for e in updates], dtype=float)
    num_workers = meta["num_workers"]
    compute = np.zeros(num_workers)
    for e in updates:
        compute[e["worker"]] += e["compute_s"]
    reached = [
        e["t"] for e in tests if e["accuracy"] is not None and e["accuracy"] >= target_accuracy
    ]
    final = tests[-1] if tests else None
    summary = {
        "status": status,
        "error": error,
        **meta,
        "eval_split": split,  # what `final`, `best_accuracy` and `time_to_target_s` read
        "clock": CLOCKS.get(meta.get("runtime")),  # null: a runtime it does not know
        "run_time_s": length,
        "updates": max((e["version"] for e in updates), default=0),
        "gradients": sum(e.get("inner_steps", 1) for e in updates),
        "final": ({k: final[k] for k in EVAL_KEYS if k in final} if final else None),
        "final_tail": final_tail(tests) if status != "diverged" else None,
        "best_accuracy": max(
            (e["accuracy"] for e in tests if e["accuracy"] is not None), default=None
        ),
        "target_accuracy": target_accuracy,
        "time_to_target_s": reached[0] if reached else None,
        "lag": {
            "mean": float(lags.mean()) if lags.size else None,
            "p50": float(np.percentile(lags, 50)) if lags.size else None,
            "p99": float(np.percentile(lags, 99)) if lags.size else None,
            "max": int(lags.max()) if lags.size else None,
        },
        "max_clock_gap": max((e.get("clock_gap", 0) for e in updates), default=0),
        "clocks": _clocks(updates, num_workers),
        # workers lost during the run that it went on without (a barrier-free algorithm)
        "workers_lost": sorted(
            e["worker"] for e in events if e["kind"] == "worker" and e["event"] == "lost"
        ),
        # of those, the places a spare took (cluster.spares), once per spare
        "workers_replaced": sorted(
            e["worker"] for e in events if e["kind"] == "worker" and e["event"] == "replaced"
        ),
        # of those, the workers whose own ranks were taken back in (left out, then back)
        "workers_back": sorted(
            e["worker"] for e in events if e["kind"] == "worker" and e["event"] == "back"
        ),
        "compute_fraction": float((compute / length).mean()) if length > 0 else None,
        "throughput_updates_per_s": (
            max((e["version"] for e in updates), default=0) / length if length > 0 else None
        ),
        "bytes_sent": end[-1].get("bytes_sent") if end else None,
        **_stages(updates, num_workers, bool((start_event(events) or {}).get("one_stream"))),
        **_consensus(updates),
    }
    if meta.get("numerics") is False:  # a cost-only run: what needs values is absent
        summary = {k: v for k, v in summary.items() if k not in NUMERIC_KEYS}
    return summary


def with_clock(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary (or a report's row of one) with its times said one way, whichever version
    wrote it: `clock` (simulated, real; None when unknown) and `run_time_s`, also where an
    old summary has only `wall_time_s` and `runtime` (its clock was the runtime's); and
    `wall_time_s`, the same number, for the readers that still name it (a claim's
    `metric: wall_time_s`). Every reader of summary.json (the report's collect, tuning)
    reads through this, and then `run_time_s` and `clock` only."""
    runtime = summary.get("runtime")
    clock = summary.get("clock") or (CLOCKS.get(runtime) if isinstance(runtime, str) else None)
    length = summary.get("run_time_s", summary.get(OLD_RUN_TIME))
    return {**summary, "clock": clock, "run_time_s": length, OLD_RUN_TIME: length}


# what a cost-only run (`numerics: false`) cannot measure, absent from its summary.json
NUMERIC_KEYS = (
    "eval_split", "final", "final_tail", "best_accuracy", "target_accuracy", "time_to_target_s",
    "weight_gap",
)  # fmt: skip


def final_tail(tests: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The end of the curve: of the held-out evaluations `tests` (one split, in time order),
    the last len // TAIL_PER of them (at least one; 10 evaluations → the last one, 20 → the
    last two), each quantity's mean over them and `evals`, how many. A quantity none of them
    has is left out (as in `final`); one that any of them lacks or has non-finite (null in
    events.jsonl) is null: the mean of fewer would not be the stated summary. None without
    evaluations."""
    if not tests:
        return None
    tail = tests[-max(1, len(tests) // TAIL_PER) :]
    out: dict[str, Any] = {}
    for key in EVAL_KEYS:
        xs = [e.get(key) for e in tail]
        if not any(key in e for e in tail):
            continue
        finite = all(isinstance(x, int | float) and math.isfinite(x) for x in xs)
        out[key] = float(np.mean(xs)) if finite else None
    return {**out, "evals": len(tail)}


def _consensus(updates: list[dict[str, Any]]) -> dict[str, Any]:
    """engine=gossip: `consensus_final`, the mean over the nodes of each one's last recorded
    consensus distance ‖z_i − z̄‖ (the `consensus` of its latest `update` that has one)."""
    last: dict[int, tuple[int, float]] = {}
    for e in updates:
        if e.get("consensus") is not None and e["version"] >= last.get(e["worker"], (-1, 0))[0]:
            last[e["worker"]] = (e["version"], e["consensus"])
    if not last:
        return {}
    return {"consensus_final": float(np.mean([d for _, d in last.values()]))}


def _clocks(updates: list[dict[str, Any]], num_workers: int) -> dict[str, Any]:
    """The workers' progress: steps each completed (its last pushed clock + 1; 0 for a worker
    that pushed nothing), as mean, std (population), min and max over the workers."""
    steps = np.zeros(num_workers)
    for e in updates:
        if 0 <= e["worker"] < num_workers:
            steps[e["worker"]] = max(steps[e["worker"]], e["clock"] + 1)
    if not updates:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {
        "mean": float(steps.mean()),
        "std": float(steps.std()),
        "min": int(steps.min()),
        "max": int(steps.max()),
    }


def _stages(updates: list[dict[str, Any]], num_workers: int, staged: bool) -> dict[str, Any]:
    """A pipeline's (its workers stages: the start event's `one_stream`): per stage,
    ‖updated weights − the weights the gradient was taken at‖ (a value: absent from a
    cost-only run), and the most updates between a microbatch's forward and its update."""
    if not staged or not updates:
        return {}
    gaps = [(e["worker"], e["weight_gap"]) for e in updates if e.get("weight_gap") is not None]
    per = [[g for w, g in gaps if w == k] for k in range(num_workers)]
    lags = [
        max((e["lag"] for e in updates if e["worker"] == k), default=0) for k in range(num_workers)
    ]
    gap = {"mean": float(np.mean([g for _, g in gaps])), "per_stage": [
        float(np.mean(p)) if p else None for p in per
    ]} if gaps else None  # fmt: skip
    return {**({"weight_gap": gap} if gap else {}), "stage_delay": lags}


def hold_room(run_dir: Path) -> None:
    """Hold room in the run directory for its summary.json (and a rank's error file),
    given up by `write_text` when the disk is full (a disk full already holds none)."""
    try:
        (Path(run_dir) / ROOM).write_bytes(bytes(ROOM_BYTES))
    except OSError:
        give_up_room(run_dir)  # not a part of it: the run's own files come first


def give_up_room(run_dir: Path) -> bool:
    """Free the run directory's held room; whether there was any."""
    try:
        (Path(run_dir) / ROOM).unlink()
    except OSError:
        return False
    return True


def write_text(path: Path, text: str, run_dir: Path | None = None) -> None:
    """Atomic write (a reader never sees half a file). On a write error (a full disk) the
    room `run_dir` holds (default: path's directory) is given up and it is written once
    more; an error then is an OSError naming `path`."""
    path = Path(path)
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    for last in (False, True):
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
            return
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if last or not give_up_room(run_dir or path.parent):
                raise write_error(exc, path) from None


def write_json(path: Path, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2) + "\n")


def finalize(
    run_dir: Path,
    meta: dict[str, Any],
    status: str,
    error: str | None,
    target_accuracy: float,
    extra: dict[str, Any] | None = None,
    events: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Write metrics.parquet and summary.json of a run directory from its events.jsonl
    (`events`: its events as `read_events` reads them, from the log that wrote them all)."""
    run_dir = Path(run_dir)
    if events is None:
        events = read_events(run_dir / "events.jsonl")
    table = run_dir / "metrics.parquet"
    try:
        metrics_table(events).to_parquet(table, index=False)
    except OSError as exc:  # a full disk: summary.json says so, in the room held for it
        table.unlink(missing_ok=True)
        status, error = "failed", _then(error, last_line(write_error(exc, table)))
    except Exception as exc:  # e.g. an import a signal cut short: summary.json is written
        table.unlink(missing_ok=True)
        status, error = "failed", _then(error, f"{table.name} not written: {last_line(exc)}")
    summary = {**summarize(events, meta, status, error, target_accuracy), **(extra or {})}
    write_json(run_dir / "summary.json", summary)
    give_up_room(run_dir)
    return summary


# the run's labels, from its start event, on every row of metrics.parquet
LABELS = (
    "algorithm", "barrier", "update_rule", "engine", "runtime", "model", "dataset", "cluster",
    "num_workers", "seed",
)  # fmt: skip


def metrics_table(events: list[dict[str, Any]]):
    """The events as one table, a column per field (first seen first) and a row per event:
    a field that is an integer wherever it is set is an integer column (pandas `Int64`,
    nulls where an event lacks it), a boolean one `boolean`, and the run's labels (`LABELS`,
    from its start event) are on every row, so that tables of many runs concatenate.

    Built a column at a time from the events grouped by their fields (a long run's are
    mostly of one shape, its updates'); a column of one Python type is typed here, any
    other left to pandas to infer, as it would from the events as rows."""
    import numpy as np
    import pandas as pd

    n, shapes = len(events), {}
    for i, event in enumerate(events):
        shapes.setdefault(tuple(event), []).append(i)
    parts: dict[str, list[tuple[np.ndarray, list[Any]]]] = {}  # (rows, values) per shape
    for keys, rows in shapes.items():
        these = [events[i] for i in rows]
        for key in keys:
            parts.setdefault(key, []).append((np.asarray(rows), [e[key] for e in these]))
    start = start_event(events)
    columns = {}
    for key, got in parts.items():
        column = _label(got, n, start.get(key)) if start and key in LABELS else None
        columns[key] = _column(got, n) if column is None else column
    return pd.DataFrame(columns)


def _label(parts: list[tuple[Any, list[Any]]], n: int, value: Any):
    """A label's column: where only the start event sets it, its `value` on all `n` rows,
    typed as the column of that one value is; else None (the column as events set it)."""
    import pandas as pd

    values = [v for _, vs in parts for v in vs if v is not None and v == v]  # NaN: unset
    if len(values) > 1:
        return None
    dtype = _column([([0], values)], 1).dtype if values else _column(parts, n).dtype
    return pd.Series(value, index=pd.RangeIndex(n), dtype=dtype)


def _column(parts: list[tuple[Any, list[Any]]], n: int):
    """One field's column of `n` rows from its values at their rows: float64 (NaN where
    unset), `Int64` or `boolean` (nulls where unset) where one type is set; any other mix
    as pandas infers it from the events as rows (NaN where a row lacks the field)."""
    import numpy as np
    import pandas as pd

    kinds = set().union(*(map(type, values) for _, values in parts)) - {type(None)}
    kind = kinds.pop() if len(kinds) == 1 else None
    if kind in (float, int, bool):
        data = np.zeros(n, dtype={float: np.float64, int: np.int64, bool: np.bool_}[kind])
        mask = np.ones(n, dtype=bool)
        try:
            for rows, values in parts:
                mask[rows] = [v is None for v in values]
                data[rows] = [kind() if v is None else v for v in values]
        except OverflowError:  # an int past int64: pandas decides
            kind = None
    if kind is float:
        return np.where(mask, np.nan, data)
    if kind is int:
        return pd.arrays.IntegerArray(data, mask)
    if kind is bool:
        return pd.arrays.BooleanArray(data, mask)
    column = np.full(n, np.nan, dtype=object)
    for rows, values in parts:
        column[rows] = values
    return pd.Series(column.tolist())


def start_event(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's start event (its labels), if it has one."""
    starts = (e for e in events if e.get("kind") == "system" and e.get("event") == "start")
    return next(starts, None)


def load_writers() -> None:
    """Import (and run once, in memory) what `finalize` writes metrics.parquet with: a
    process that will end a run calls this before the run starts, so that a signal that
    lands while it ends its run cannot land in a first import (an import cut short by an
    exception leaves pandas half-registered, and the next import of it fails)."""
    import io

    import pandas as pd

    pd.DataFrame({"t": [0.0], "kind": ["system"]}).to_parquet(io.BytesIO(), index=False)


def _then(error: str | None, more: str) -> str:
    return f"{error}; then {more}" if error else more


def _ended(events: list[dict[str, Any]], status: str, error: str | None):
    """An interrupt while a failed (diverged, timed-out) run was winding down leaves that
    status, with the run's error and then the interrupt's."""
    system = [e for e in events if e.get("kind") == "system"]
    end = next((e for e in reversed(system) if e.get("event") == "end"), None)
    if status != "interrupted" or not end or end.get("status") in (None, "completed"):
        return status, error
    said = [e.get("error") for e in system if e.get("event") == "error"]
    return end["status"], "; then ".join(m for m in (said[-1] if said else None, error) if m)


def stop(
    run_dir: Path, meta: dict[str, Any], status: str, error: str | None, target_accuracy: float
) -> dict[str, Any]:
    """End a run its writers did not end (interrupted, timed out, a rank lost): a last
    system event says why, at the time of the last event written, then the files."""
    path = Path(run_dir) / "events.jsonl"
    with contextlib.suppress(OSError):  # what the disk did not take is lost (and said)
        EventLog.flush_all(path)
    events = read_events(path)
    t = max((e["t"] for e in events), default=0.0)
    status, error = _ended(events, status, error)
    try:
        if path.exists() and path.stat().st_size:
            with open(path, "rb+") as f:  # a writer killed mid-line: its torn line apart
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
        events = EventLog(path)
        events.emit("system", t, event="stop", status=status, reason=error)
        events.close()
    except OSError as exc:  # a full disk: no stop event; summary.json still says why
        log.error("%s", write_error(exc, path))
    return finalize(run_dir, meta, status, error, target_accuracy)

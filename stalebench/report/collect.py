"""Find run directories and load them into three tidy DataFrames (runs, curves, updates)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from stalebench import tuning
from stalebench.metrics.summary import with_clock
from stalebench.overrides import keeps_preset_name

LABELS = ["algorithm", "cluster", "num_workers", "seed"]
CURVE_COLUMNS = ["run_dir", *LABELS, "t", "version", "split", "loss", "accuracy", "perplexity"]
UPDATE_FIELDS = [
    "t",
    "worker",
    "clock",
    "version",
    "lag",
    "loss",
    "compute_s",
    "wait_s",
    "comm_s",
    "clock_gap",
]
UPDATE_COLUMNS = ["run_dir", *LABELS, *UPDATE_FIELDS]


def is_run_dir(path: Path) -> bool:
    """A run directory holds summary.json, or events.jsonl next to Hydra's .hydra/."""
    return (path / "summary.json").is_file() or (
        (path / "events.jsonl").is_file() and (path / ".hydra").is_dir()
    )


def find_run_dirs(dirs: Iterable[str | os.PathLike]) -> list[Path]:
    """Every run directory at or under the given directories (sorted, without duplicates).
    A tuned sweep's tuning stage (`tune/` beside its `tuning.json`) is not the sweep's: it
    is left out below a sweep directory, and reported only when named itself."""
    found: set[Path] = set()
    for top in dirs:
        top = Path(top)
        if not top.is_dir():
            raise FileNotFoundError(f"not a directory: {top}")
        for root, subdirs, _files in os.walk(top):
            path = Path(root)
            if is_run_dir(path):
                found.add(path.resolve())
                subdirs[:] = []  # a run directory holds no other runs
            else:
                tuned = (path / tuning.FILE).is_file()
                subdirs[:] = sorted(
                    d
                    for d in subdirs
                    if not d.startswith(".") and not (tuned and d == tuning.STAGE_DIR)
                )
    return sorted(found, key=_natural_key)


def _natural_key(path: Path):
    """Multirun jobs 0, 1, …, 10 in numeric order; a named sibling after the numbered ones."""
    return [(int(p), p) if p.isdigit() else (math.inf, p) for p in path.parts]


class RunFileWarning(UserWarning):
    """A file of a run directory is damaged; the message is one line naming the run."""


@dataclasses.dataclass
class EventFile:
    """events.jsonl as read: its events, how many lines it has (blank ones apart), and
    where (1-based line numbers) those that are not an event are."""

    events: list[dict]
    lines: int  # the non-blank lines
    unreadable: list[int]  # the line numbers of those that are not a JSON object
    last: int  # the number of the last non-blank line (0: none)


def scan_events(path: str | os.PathLike) -> EventFile:
    """Every line of events.jsonl that is a JSON object, and where the others are."""
    lines = Path(path).read_text(errors="replace").splitlines()
    events, unreadable, count, last = [], [], 0, 0
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        count, last = count + 1, i
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            event = None
        if isinstance(event, dict):
            events.append(event)
        else:
            unreadable.append(i)
    return EventFile(events, count, unreadable, last)


def read_events(path: str | os.PathLike) -> list[dict]:
    """events.jsonl line by line; a torn last line (the run died mid-write) is skipped."""
    log = scan_events(path)
    for i in log.unreadable:
        if i != log.last:
            warnings.warn(f"{path}:{i}: unreadable event line skipped", stacklevel=2)
    return log.events


def damage(log: EventFile, finished: bool) -> str | None:
    """What is wrong with a run's events.jsonl and what the report draws from it, in one
    line; None when nothing is. Of a run that did not finish (no summary.json) a torn last
    line or an empty log is expected: it died writing."""
    torn = log.last in log.unreadable
    inner = [i for i in log.unreadable if i != log.last]
    if not log.lines:
        return "events.jsonl is empty: its curve is left out" if finished else None
    parts = []
    if inner:
        shown = ", ".join(map(str, inner[:5])) + (
            f" and {len(inner) - 5} more" if len(inner) > 5 else ""
        )
        parts.append(
            f"line {shown} does not parse" if len(inner) == 1 else f"lines {shown} do not parse"
        )
    if torn and finished:
        parts.append(f"its last line ({log.last}) is cut mid-record")
    if not parts:
        return None
    n = len(log.events)
    if any(e.get("kind") == "eval" for e in log.events):
        drawn = f"its curve is drawn from the {n} lines that parse"
    elif n:
        drawn = f"none of the {n} lines that parse is an eval event: its curve is left out"
    else:
        drawn = "no line parses: its curve is left out"
    return f"events.jsonl: {' and '.join(parts)}; {drawn}"


def _flatten(obj: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}_"))
        else:
            out[name] = value
    return out


def _yaml_scalars(text: str) -> dict[str, str]:
    """Dotted keys → scalar strings of a block-style YAML mapping (enough for Hydra's
    config.yaml; lists and flow values are ignored). Avoids a YAML dependency."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, _, value = stripped.partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key.strip()])
        value = value.strip()
        if value:
            out[dotted] = value.strip("'\"")
        else:
            stack.append((indent, key.strip()))
    return out


# a run's label names the parts that decide how it coordinates first, then the optimizer
# it steps with: `<barrier>+<update>`, `<schedule>+<optimizer>`, `<outer>+<inner>`,
# `<mixing>+<inner>` (an engine's slots, which a report cannot ask the engines for)
OPTIMIZER_PARTS = ("update", "inner", "optimizer")


def _algorithm_label(cfg: dict[str, str], overrides_file: Path) -> str | None:
    """The algorithm's label as the run gave it: the preset's name, unless a part was
    swapped on the command line (without `algorithm.name=`) or the name is empty; then its
    parts joined by `+`: those config.yaml holds (the parts the run's engine does not read
    are null there), the optimizer last."""
    name = cfg.get("algorithm.name")
    overrides = []
    if overrides_file.is_file():
        overrides = [
            o.strip().removeprefix("- ").strip("'\"")
            for o in overrides_file.read_text().splitlines()
        ]
    if name and keeps_preset_name(overrides):
        return name
    parts: dict[str, str] = {}
    for key, value in cfg.items():
        root, *rest = key.split(".")
        if root == "algorithm" and len(rest) == 2 and value not in ("null", ""):
            slot, field = rest  # a part is labelled by its name; one without, its schedule
            if field == "name" or (field == "schedule" and f"algorithm.{slot}.name" not in cfg):
                parts[slot] = value
    ordered = sorted(parts, key=lambda slot: slot in OPTIMIZER_PARTS)  # stable: config order
    return "+".join(parts[slot] for slot in ordered) if parts else name


def hydra_labels(run_dir: Path) -> dict:
    """The labels (algorithm, cluster, num_workers, seed, runtime, engine) of a run
    directory as its .hydra/config.yaml gives them (empty without one)."""
    labels = _labels_without_summary(Path(run_dir), [])
    return {k: v for k, v in labels.items() if k in (*LABELS, "runtime", "engine")}


def _labels_without_summary(run_dir: Path, events: list[dict]) -> dict:
    """Labels of a run that wrote no summary.json: its start event, else .hydra/config.yaml."""
    start = next((e for e in events if e.get("kind") == "system" and e.get("event") == "start"), {})
    labels = {k: v for k, v in start.items() if k not in ("kind", "t", "event")}
    config = run_dir / ".hydra" / "config.yaml"
    if config.is_file():
        cfg = _yaml_scalars(config.read_text())
        fallback = {
            "algorithm": _algorithm_label(cfg, run_dir / ".hydra" / "overrides.yaml"),
            "cluster": cfg.get("cluster.preset") or cfg.get("cluster.name"),
            "num_workers": cfg.get("cluster.num_workers"),
            "seed": cfg.get("seed"),
            "runtime": cfg.get("runtime"),
            "engine": cfg.get("engine.name"),
        }
        for key, value in fallback.items():
            if labels.get(key) is None and value is not None:
                labels[key] = int(value) if key in ("num_workers", "seed") else value
    errors = [e for e in events if e.get("kind") == "system" and e.get("event") == "error"]
    labels["status"] = "failed"
    labels["error"] = "no summary.json"
    if errors:
        detail = errors[-1].get("error") or errors[-1].get("message")
        if detail:
            labels["error"] += f" (last error event: {detail})"
    times = [e["t"] for e in events if isinstance(e.get("t"), int | float)]
    labels["run_time_s"] = max(times) if times else None
    labels["updates"] = max(
        (e.get("version", 0) for e in events if e.get("kind") == "update"), default=0
    )
    return labels


def collect(
    dirs: Iterable[str | os.PathLike], damaged: list[tuple[str, str]] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Load every run under ``dirs``.

    Returns ``runs`` (one row per run: the flattened summary, e.g. ``final_accuracy``,
    ``lag_mean``, its clock and length as `with_clock` says them, plus ``run_dir``),
    ``curves`` (the eval events) and ``updates`` (the update events), the latter two
    labelled with run_dir, algorithm, cluster, num_workers and seed. A run without
    summary.json appears with status "failed". A run whose events.jsonl is damaged
    (`damage`) is kept, with the events that parse, and its (run_dir, what is wrong) is
    appended to ``damaged`` when given, else is a RunFileWarning "<run_dir>: <what>".
    """
    rows, curves, updates = [], [], []
    for run_dir in find_run_dirs(dirs):
        events_path = run_dir / "events.jsonl"
        log = scan_events(events_path) if events_path.is_file() else EventFile([], 0, [], 0)
        events = log.events
        summary_path = run_dir / "summary.json"
        finished = summary_path.is_file()
        if finished:
            try:
                row = _flatten(json.loads(summary_path.read_text()))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                row = _labels_without_summary(run_dir, events)
                row["error"] = f"unreadable summary.json: {err}"
                finished = False  # its status says so already
        else:
            row = _labels_without_summary(run_dir, events)
        problem = damage(log, finished) if events_path.is_file() else None
        if problem and damaged is not None:
            damaged.append((str(run_dir), problem))
        elif problem:
            warnings.warn(RunFileWarning(f"{run_dir}: {problem}"), stacklevel=2)
        row = with_clock(row)  # an old summary's times as a new one says them: one place
        row["run_dir"] = str(run_dir)
        rows.append(row)
        labels = {"run_dir": str(run_dir), **{k: row.get(k) for k in LABELS}}
        for e in events:
            if e.get("kind") == "eval":
                curves.append({**labels, **{k: e.get(k) for k in CURVE_COLUMNS[5:]}})
            elif e.get("kind") == "update":
                updates.append({**labels, **{k: e.get(k) for k in UPDATE_FIELDS}})
    runs = pd.DataFrame(rows)
    if not runs.empty:
        first = ["run_dir", *LABELS, "status", "error"]
        runs = runs[[c for c in first if c in runs] + [c for c in runs if c not in first]]
    return (
        runs,
        pd.DataFrame(curves, columns=CURVE_COLUMNS),
        pd.DataFrame(updates, columns=UPDATE_COLUMNS),
    )

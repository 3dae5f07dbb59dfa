"""The tuning protocol's selection, from run directories alone (no torch, no engine, like
the report): each grid point of a cell is scored on its tuning runs' validation split, the
points are ranked, the best is selected, and the whole record is `tuning.json`.

The sweeper (hydra_plugins/stalebench_sweeper) lays the runs out and launches them; this
module only reads what they wrote. The rule (docs/design.md, "Tuning protocol"):

1. a point all of whose runs completed and reached a value of the metric ranks by the mean
   of that value over the tuning seeds (`select.better`), ties by the mean final validation
   loss;
2. then the points all of whose runs completed but some never reached the target (or have
   no value of the metric): fewer such runs first, then by the mean final validation loss;
3. last, the points with a run that diverged, failed or is missing: fewer such runs first,
   then by the mean final validation loss of the others.

What is left tied goes to the earlier point of the grid.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

from stalebench.errors import RunError
from stalebench.metrics.events import read_events
from stalebench.metrics.summary import write_json
from stalebench.sweep import TARGET_KEYS, SelectConfig, TuneConfig

FORMAT = 1  # tuning.json's format version
FILE = "tuning.json"  # in the sweep directory
STAGE_DIR = "tune"  # the tuning stage's runs: <sweep_dir>/tune/<cell>/<point>/<seed>
STANDINGS = ("reached", "not_reached", "failed")  # a grid point's tier, best first
TERMINAL = ("completed", "diverged")  # a run that need not run again on resume


def grid(params: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The points of a tuning grid, the first key slowest (as Hydra's basic sweeper orders
    a product)."""
    keys = list(params)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*params.values())]


def run_dir(cell: int, point: int, seed: int) -> str:
    """A tuning run's directory, relative to the sweep directory (fixed, so that a rerun of
    the same sweep finds it)."""
    return f"{STAGE_DIR}/{cell}/{point}/{seed}"


@dataclasses.dataclass
class Run:
    """One tuning run as selection sees it."""

    seed: int
    dir: str  # relative to the sweep directory
    status: str  # summary.json's, or "missing" (no readable summary.json)
    value: float | None  # the metric; None: never reached the target, or no value
    final_loss: float | None  # the final validation loss; None when non-finite or absent

    @property
    def ok(self) -> bool:
        return self.status == "completed"


def read_run(sweep_dir: Path, rel: str, seed: int, select: SelectConfig) -> Run:
    """Score one tuning run from its summary.json (and events.jsonl for time_to_target).
    A finished run that evaluated anything but the validation split is refused: selecting
    on the test split is the leak the protocol exists to prevent."""
    path = Path(sweep_dir) / rel
    try:
        summary = json.loads((path / "summary.json").read_text())
        status = summary["status"]
    except (OSError, ValueError, KeyError, TypeError):
        return Run(seed, rel, "missing", None, None)
    if status in TERMINAL and summary.get("eval_split") != "val":
        raise RunError(
            f"{path}: a tuning run must evaluate the validation split (eval.split=val), but "
            f"its summary.json reads {summary.get('eval_split')!r}"
        )
    final_loss = _finite((summary.get("final") or {}).get("loss"))
    if status != "completed":
        return Run(seed, rel, status, None, final_loss)
    if select.metric == "time_to_target":
        value = time_to_target(path / "events.jsonl", select.target.key, select.target.value)
    else:
        value = _finite(summary_value(summary, select.metric))
    return Run(seed, rel, status, value, final_loss)


def time_to_target(events_path: Path, key: str, value: float) -> float | None:
    """The first snapshot time at which the validation split's `key` reaches `value` (at or
    below for loss and perplexity, at or above for accuracy); None if it never does."""
    evals = sorted(
        (e for e in read_events(events_path) if e.get("kind") == "eval" and e["split"] == "val"),
        key=lambda e: (e["t"], e["version"]),
    )
    for e in evals:
        x = e.get(key)
        if x is not None and (x <= value if TARGET_KEYS[key] == "lower" else x >= value):
            return float(e["t"])
    return None


def summary_value(summary: dict[str, Any], key: str) -> Any:
    """A summary.json value by its key flattened with "_" (final_loss: summary["final"]
    ["loss"]); None when there is none."""
    if key in summary and not isinstance(summary[key], dict):
        return summary[key]
    for i, char in enumerate(key):
        if char == "_" and isinstance(summary.get(key[:i]), dict):
            found = summary_value(summary[key[:i]], key[i + 1 :])
            if found is not None:
                return found
    return None


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _mean(xs: list[float | None]) -> float | None:
    return sum(xs) / len(xs) if xs and all(x is not None for x in xs) else None


def standing(runs: list[Run]) -> str:
    """A grid point's tier: every run completed with a value (reached), every run completed
    (not_reached), or not (failed)."""
    if not all(r.ok for r in runs):
        return "failed"
    return "reached" if all(r.value is not None for r in runs) else "not_reached"


def rank_key(index: int, runs: list[Run], better: str) -> tuple:
    """The sort key of one grid point (smaller is better): its tier, then the rule's
    numbers, then its place in the grid."""
    tier = standing(runs)
    ok = [r for r in runs if r.ok]
    losses = [r.final_loss for r in ok]
    loss = _mean(losses) if losses else None
    loss = math.inf if loss is None else loss
    if tier == "reached":
        score = _mean([r.value for r in runs])
        return (0, -score if better == "higher" else score, loss, index)
    if tier == "not_reached":
        return (1, sum(r.value is None for r in runs), loss, index)
    return (2, len(runs) - len(ok), loss, index)


def choose(points: list[dict[str, Any]], runs: list[list[Run]], better: str) -> dict[str, Any]:
    """A cell's selection: every candidate (its values, runs, standing, score, mean final
    validation loss and rank) and the selected one."""
    if not points or len(points) != len(runs) or any(not r for r in runs):
        raise ValueError("every grid point needs its runs")
    order = sorted(range(len(points)), key=lambda i: rank_key(i, runs[i], better))
    ranks = {i: r + 1 for r, i in enumerate(order)}
    candidates = []
    for i, (values, point_runs) in enumerate(zip(points, runs, strict=True)):
        tier = standing(point_runs)
        ok_losses = [r.final_loss for r in point_runs if r.ok]
        candidates.append(
            {
                "candidate": i,
                "values": values,
                "rank": ranks[i],
                "standing": tier,
                "score": _mean([r.value for r in point_runs]) if tier == "reached" else None,
                "final_val_loss": _mean(ok_losses) if ok_losses else None,
                "runs": [dataclasses.asdict(r) for r in point_runs],
            }
        )
    best = order[0]
    return {"selected": dict(points[best]), "selected_candidate": best, "candidates": candidates}


def record(tune: TuneConfig, cells: list[dict[str, Any]], sweep_dir: Path) -> dict[str, Any]:
    """tuning.json's content: the protocol, then per cell (its overrides, arm and grid;
    its runs in `sweep_dir` where `run_dir` puts them) the candidates scored and the
    selection. `cells[i]`: {"overrides", "arm", "params"}; a cell with an empty grid (its
    keys all set by the sweep's overrides) is recorded untuned: no candidates, budget 0."""
    select = tune.select
    out_cells = []
    for i, cell in enumerate(cells):
        out = {
            "cell": i,
            "overrides": list(cell["overrides"]),
            "arm": cell.get("arm"),
            "params": {k: list(v) for k, v in cell["params"].items()},
        }
        if not cell["params"]:  # every key of its grid set by the sweep's overrides
            out_cells.append(
                {**out, "budget": 0, "selected": {}, "selected_candidate": None, "candidates": []}
            )
            continue
        points = grid(cell["params"])
        runs = [
            [read_run(sweep_dir, run_dir(i, j, s), s, select) for s in tune.seeds]
            for j in range(len(points))
        ]
        out["budget"] = len(points) * len(tune.seeds)
        out_cells.append({**out, **choose(points, runs, select.better)})
    return {
        "format": FORMAT,
        "select": dataclasses.asdict(select),
        "seeds": list(tune.seeds),
        "validation_fraction": tune.validation_fraction,
        "budget": max((c["budget"] for c in out_cells), default=0),
        "cells": out_cells,
    }


def write(sweep_dir: Path, content: dict[str, Any]) -> Path:
    path = Path(sweep_dir) / FILE
    write_json(path, content)
    return path

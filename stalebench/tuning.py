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

A cell whose best point sits at an edge of its grid on a geometric axis (`ratio`) is
extended beyond that edge by the axis's own ratio, one point at a time (`extension`: a
pure decision on the points tried so far), until the best is interior, the point beyond
the edge failed or diverged for every tuning seed (the edge is then interior by
definition), or `sweep.tune.max_extensions` points were added (still at the edge).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

from stalebench.errors import ConfigError, RunError
from stalebench.metrics.events import read_events
from stalebench.metrics.summary import with_clock, write_json
from stalebench.sweep import TARGET_KEYS, SelectConfig, TuneConfig

FORMAT = 1  # tuning.json's format version
FILE = "tuning.json"  # in the sweep directory
STAGE_DIR = "tune"  # the tuning stage's runs: <sweep_dir>/tune/<cell>/<point>/<seed>
STANDINGS = ("reached", "not_reached", "failed")  # a grid point's tier, best first
TERMINAL = ("completed", "diverged")  # a run that need not run again on resume
# why a cell's extension stopped: its best is interior; or interior by definition (the
# point beyond its edge failed or diverged for every tuning seed); or still at an edge,
# because the cap of extensions was reached or the axis cannot be extended (non-numeric,
# not geometric)
STOPS = ("interior", "diverged", "cap", "not_geometric")
RTOL = 1e-6  # adjacent ratios this close (relatively) are one ratio


def grid(params: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The points of a tuning grid, the first key slowest (as Hydra's basic sweeper orders
    a product)."""
    keys = list(params)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*params.values())]


def run_dir(cell: int, point: int, seed: int) -> str:
    """A tuning run's directory, relative to the sweep directory (fixed, so that a rerun of
    the same sweep finds it)."""
    return f"{STAGE_DIR}/{cell}/{point}/{seed}"


def ratio(values: list[Any]) -> float | None:
    """A grid axis's own ratio: sorted, the ratio of adjacent points, when every value is a
    positive number (not a bool) and every adjacent ratio is the same (to RTOL); None for
    an axis of one point, or one that is not numeric or not geometric (never extended)."""
    if len(values) < 2 or not all(_number(v) and v > 0 for v in values):
        return None
    xs = sorted(float(v) for v in values)
    ratios = [b / a for a, b in itertools.pairwise(xs)]
    r = ratios[0]
    if r <= 1 or any(not math.isclose(q, r, rel_tol=RTOL) for q in ratios):
        return None
    return r


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def beyond(values: list[Any], value: Any, side: str) -> Any:
    """The next point of a geometric axis beyond `value` on `side` (top: ×ratio, bottom:
    ÷ratio), rounded to 12 significant digits so that it reads as written (0.8, not
    0.8000000000000002); an integer axis stays integer (None when the point is not)."""
    r = ratio(values)
    if r is None:
        return None
    x = float(f"{(value * r if side == 'top' else value / r):.12g}")
    if all(isinstance(v, int) for v in values):
        return int(x) if x.is_integer() else None
    return x


@dataclasses.dataclass
class Decision:
    """What a cell's extension does next: `next` the point to run (its values; `key` and
    `side` the axis and edge it extends), or None and why it stopped (`stopped`, one of
    STOPS; `at_edge`: the keys whose best value is still at an edge of its grid)."""

    next: dict[str, Any] | None = None
    key: str | None = None
    side: str | None = None
    stopped: str | None = None
    at_edge: list[str] = dataclasses.field(default_factory=list)


def extension(
    params: dict[str, list[Any]],
    points: list[dict[str, Any]],
    dead: list[bool],
    best: int,
    left: int,
) -> Decision:
    """The extension rule, pure: `points` the points tried (the grid's, then the ones
    added), `dead[j]` whether every tuning run of point j failed or diverged, `best` the
    selected point, `left` how many more points the cap allows. Along every axis of two or
    more values (in the grid's key order), the best point's value is looked at among the
    points that share its other values: on a side with no point beyond it, it is at the
    edge; with points beyond it that are all dead, it is interior by definition
    (diverged); otherwise interior. The first open edge of a geometric axis is extended by
    its ratio (`beyond`) while `left` allows."""
    chosen = points[best]
    edges: list[tuple[str, str]] = []  # (key, side) at an open edge
    diverged = False
    for key, values in params.items():
        if len(values) < 2 or not all(_number(v) for v in values):
            continue  # one value (not tuned), or not numbers: no edge to speak of
        others = {k: v for k, v in chosen.items() if k != key}
        line = [
            (p[key], dead[j])
            for j, p in enumerate(points)
            if all(p.get(k) == v for k, v in others.items())
        ]
        x = chosen[key]
        for side in ("bottom", "top"):
            past = [d for v, d in line if (v < x if side == "bottom" else v > x)]
            if not past:
                edges.append((key, side))
            elif all(past):
                diverged = True
    at_edge = list(dict.fromkeys(k for k, _ in edges))
    for key, side in edges:
        value = beyond(params[key], chosen[key], side)
        if value is None:
            continue
        if left <= 0:
            return Decision(stopped="cap", at_edge=at_edge)
        return Decision(next={**chosen, key: value}, key=key, side=side, at_edge=at_edge)
    if edges:
        return Decision(stopped="not_geometric", at_edge=at_edge)
    return Decision(stopped="diverged" if diverged else "interior")


def check_resolution(cells: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The equal protocol: every arm's grid has the same ratios (the resolution: the sorted
    distinct ratios of its geometric axes, `ratio`), else a ConfigError naming every arm
    and its ratios. `cells` as `record` takes them (a cell without an arm is the sweep's
    grid); returns arm -> ratios."""
    resolution: dict[str, list[float]] = {}
    for cell in cells:
        if not cell["params"]:
            continue
        ratios = sorted({r for v in cell["params"].values() if (r := ratio(list(v)))})
        name = str(cell.get("arm") or "the sweep's grid")
        resolution.setdefault(name, ratios)
    distinct: list[list[float]] = []
    for ratios in resolution.values():
        if not any(_same(ratios, seen) for seen in distinct):
            distinct.append(ratios)
    if len(distinct) > 1:
        shown = "; ".join(
            f"{arm} {', '.join(f'x{r:.6g}' for r in ratios) or 'none (not geometric)'}"
            for arm, ratios in resolution.items()
        )
        raise ConfigError(
            "sweep.tune.params/sweep.tune.arms: every arm's grid must have the same ratio "
            f"of adjacent points (one resolution), got: {shown}"
        )
    return resolution


def _same(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, rel_tol=RTOL) for x, y in zip(a, b, strict=True)
    )


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
        summary = with_clock(json.loads((path / "summary.json").read_text()))
        status = summary["status"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not an object
        return Run(seed, rel, "missing", None, None)
    if status in TERMINAL and summary.get("eval_split") != "val":
        raise RunError(
            f"{path}: a tuning run must evaluate the validation split (eval.split=val), but "
            f"its summary.json reads {summary.get('eval_split')!r}"
        )
    final_loss = _finite(summary_value(summary, "final_loss"))
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
    """A summary.json value by its key flattened with "_" (best_accuracy:
    summary["best_accuracy"]); None when there is none. final_loss, final_accuracy and
    final_perplexity read the end of the curve, as a claim does: summary["final_tail"] (the
    mean over the last 10 % of the evaluations), or, in a summary written before it
    existed, the last snapshot summary["final"]."""
    quantity = key.removeprefix("final_")
    if quantity != key and isinstance(tail := summary.get("final_tail"), dict):
        if quantity in tail and quantity != "evals":
            return tail[quantity]
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


def record(
    tune: TuneConfig,
    cells: list[dict[str, Any]],
    sweep_dir: Path,
    added: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """tuning.json's content: the protocol, then per cell (its overrides, arm and grid;
    its runs in `sweep_dir` where `run_dir` puts them) the candidates scored, the
    selection, and its extension. `cells[i]`: {"overrides", "arm", "params"}; a cell with
    an empty grid (its keys all set by the sweep's overrides) is recorded untuned: no
    candidates, budget 0. `added[i]`: the points cell i's extension ran so far, in order
    (each a `Decision`'s {"values", "key", "side"}); a cell whose extension goes on has
    `extension.next` (the sweeper runs it and records again; a finished record has none)."""
    select = tune.select
    added = added or [[] for _ in cells]
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
                {**out, "budget": 0, "points": 0, "selected": {}, "selected_candidate": None}
                | {"candidates": []}
            )
            continue
        base = grid(cell["params"])
        points = [*base, *(a["values"] for a in added[i])]
        runs = [
            [read_run(sweep_dir, run_dir(i, j, s), s, select) for s in tune.seeds]
            for j in range(len(points))
        ]
        chosen = choose(points, runs, select.better)
        decision = extension(
            out["params"],
            points,
            [not any(r.ok for r in rs) for rs in runs],
            chosen["selected_candidate"],
            tune.max_extensions - len(added[i]),
        )
        ext = {
            "ratio": {k: ratio(v) for k, v in out["params"].items()},
            "added": [
                {"candidate": len(base) + n, "key": a["key"], "side": a["side"]}
                | {"values": a["values"]}
                for n, a in enumerate(added[i])
            ],
            "stopped": decision.stopped,
            "at_edge": decision.at_edge,
        }
        if decision.next is not None:
            ext["next"] = {"values": decision.next, "key": decision.key, "side": decision.side}
        out["points"] = len(points)
        out["budget"] = len(points) * len(tune.seeds)
        out_cells.append({**out, **chosen, "extension": ext})
    arms: dict[str, list[int]] = {}
    for c in out_cells:
        arms.setdefault(str(c["arm"] or "the sweep's grid"), []).append(c["points"])
    return {
        "format": FORMAT,
        "select": dataclasses.asdict(select),
        "seeds": list(tune.seeds),
        "validation_fraction": tune.validation_fraction,
        # the grid's runs per cell, before extensions (each cell's `budget`: with them)
        "budget": max(
            (len(grid(c["params"])) * len(tune.seeds) for c in cells if c["params"]), default=0
        ),
        "max_extensions": tune.max_extensions,
        "points": arms,  # per arm, the points each of its cells ran (extensions included)
        "cells": out_cells,
    }


def write(sweep_dir: Path, content: dict[str, Any]) -> Path:
    path = Path(sweep_dir) / FILE
    write_json(path, content)
    return path

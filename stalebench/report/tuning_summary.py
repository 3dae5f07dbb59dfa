"""The tuning stage's summary in docs/results.md: per tuned cell, the grid's values with the
chosen one, whether it lay at the grid's edge and how an extension of the grid stopped."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from stalebench.report.tables import to_markdown


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    if isinstance(x, list):
        return ", ".join(_cell(y) for y in x)
    if isinstance(x, dict):
        return json.dumps(x, sort_keys=True)
    return "—" if x is None else str(x)


def _edge(value: Any, values: Any) -> str:
    """' (edge)' when a numeric grid's selection is its smallest or largest value: the best
    may lie outside the grid, a reader should know."""
    try:
        numbers = sorted(float(v) for v in values)
        x = float(value)
    except (TypeError, ValueError):
        return ""
    return " (edge)" if len(numbers) > 2 and x in (numbers[0], numbers[-1]) else ""


# why a cell's edge extension stopped (stalebench.tuning.STOPS), as the report says it
STOPPED = {
    "interior": "interior",
    "diverged": "interior: failed or diverged beyond",
    "cap": "at the edge: cap reached",
    "not_geometric": "at the edge: grid not geometric",
}


def _extension(ext: Any) -> str:
    """A cell's edge extension: the values it added beyond the grid's edge, and why it
    stopped (`+0.4, 0.8 (interior: failed or diverged beyond)`)."""
    if not isinstance(ext, dict):
        return "—"
    added = [a for a in ext.get("added") or [] if isinstance(a, dict)]
    shown = ", ".join(
        _cell((a.get("values") or {}).get(a.get("key"))) if len(a.get("values") or {}) < 2
        else f"{a.get('key')} = {_cell((a.get('values') or {}).get(a.get('key')))}"
        for a in added
    )  # fmt: skip
    stopped = STOPPED.get(ext.get("stopped"), _cell(ext.get("stopped")))
    return (f"+{shown}" if shown else "none") + f" ({stopped})"


def _tuning_rows(cells: list[Any], metric: str) -> pd.DataFrame:
    """One row per tuned cell: the overrides that tell it from the other cells, its grid,
    the selected point and that point's score and standing; with an edge extension (a
    tuning.json that records one), the points it ran and what it added beyond the grid."""
    cells = [c for c in cells if isinstance(c, dict)]
    lists = [[str(o) for o in c.get("overrides") or []] for c in cells]
    shared = set.intersection(*map(set, lists)) if len(lists) > 1 else set()
    extensions = any("extension" in c for c in cells)  # a tuning.json that records them
    rows = []
    for cell, overrides in zip(cells, lists, strict=True):
        points = cell.get("candidates") or []
        chosen = cell.get("selected_candidate")
        point = next(
            (p for p in points if isinstance(p, dict) and p.get("candidate") == chosen), {}
        )
        grid = cell.get("params") or {}
        ext = cell.get("extension")
        at_edge = (ext.get("at_edge") or []) if isinstance(ext, dict) else []
        selected = cell.get("selected") or {}
        # with an extension, an edge is what it left at the edge (not the grid's own)
        marks = {
            k: (" (edge)" if k in at_edge else "") if ext is not None else _edge(v, grid.get(k))
            for k, v in selected.items()
        }
        extended = (
            {"points": _cell(cell.get("points")), "extension": _extension(ext)}
            if extensions
            else {}
        )
        rows.append(
            {
                "cell": " ".join(o for o in overrides if o not in shared)
                or _cell(cell.get("arm", cell.get("cell"))),
                "grid": "; ".join(f"{k} ∈ {{{_cell(v)}}}" for k, v in grid.items()) or "—",
                "selected": ", ".join(f"{k} = {_cell(v)}{marks[k]}" for k, v in selected.items())
                or "—",
                f"score ({metric})": _cell(point.get("score")),
                "standing": _cell(point.get("standing")),
                **extended,
            }
        )
    return pd.DataFrame(rows)


def _setting(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {_setting(v)}" for k, v in value.items() if v is not None)
    return _cell(value)


def tuning_summary(tuning: Any) -> list[str]:
    """tuning.json in a few lines: the protocol's settings, then a table of every cell's
    grid and selection."""
    if tuning is None:
        return ["No tuning stage: every arm ran as its sweep file sets it."]
    if not isinstance(tuning, dict):
        return [f"Tuning: {_cell(tuning)}"]
    select = tuning.get("select") if isinstance(tuning.get("select"), dict) else {}
    settings = {k: v for k, v in tuning.items() if k not in ("cells", "format") and v is not None}
    shown = [f"{k}: {_setting(v)}" for k, v in settings.items()]
    lines = ["Tuning (`tuning.json`): " + ("; ".join(shown) or "—") + "."]
    cells = tuning.get("cells")
    if isinstance(cells, list) and cells:
        table = _tuning_rows(cells, str(select.get("metric") or "score"))
        lines += ["", to_markdown(table).rstrip("\n")]
    return lines

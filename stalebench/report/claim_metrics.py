"""One run's number for a claim: a time to target (censored at the run's end when never
reached, flagged when met at t = 0 or followed by a blow-up), a final accuracy, loss or
perplexity (summary.json's `final_tail`), or any other summary field; a diverged run is
usable only as never reaching a target, a failed or timed-out one not at all."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from stalebench.metrics.summary import EVAL_KEYS, final_tail
from stalebench.report.claim_selection import add_sweep
from stalebench.sweep import TARGET_KEYS, ClaimConfig, TargetConfig

USABLE = ("completed", "diverged")  # a failed or timed-out run measures nothing
# budget.diverge_factor's default (stalebench.config.BudgetConfig; a report imports no run
# config): a run's own value is read from its config
DIVERGE_FACTOR = 10.0
# the short caveats a verdict record lists (`caveats`), each also noted per seed in `notes`
BLOW_UP = "blow-up after the target"
AT_ZERO = "target met at t = 0"
# a claim's final_accuracy / final_loss / final_perplexity: the quantity's final_tail
TAIL_METRICS = {f"final_{k}": k for k in EVAL_KEYS}


@dataclasses.dataclass
class Value:
    x: float
    censored: bool = False  # time to target never reached: x is the run's end, a lower bound
    # caveats of this seed's number (BLOW_UP, AT_ZERO) -> what happened, for the notes
    flags: dict[str, str] = dataclasses.field(default_factory=dict)


def claim_targets(configs: Iterable[dict[str, Any]]) -> list[TargetConfig]:
    """The distinct targets of the time-to-target claims of the sweeps the runs' configs
    (already read: `groups.load_configs`) belong to, in the order the claims name them."""
    sweeps: dict[str, dict] = {}
    for config in configs:
        add_sweep(config, sweeps)
    found: list[TargetConfig] = []
    for sweep in sweeps.values():
        for claim in sweep["claims"]:
            if claim.target is not None and claim.target not in found:
                found.append(claim.target)
    return found


def target_label(t: TargetConfig) -> str:
    """`time to test loss <= 0.01`: a target as the report's columns name it."""
    sign = "<=" if TARGET_KEYS[t.key] == "lower" else ">="
    return f"time to {t.split} {t.key} {sign} {t.value:g}"


def first_reached(curve: pd.DataFrame | None, t: TargetConfig) -> float | None:
    """The first evaluation time at which `t` is reached on `curve` (None: never)."""
    if curve is None or curve.empty:
        return None
    points = curve[curve["split"] == t.split].sort_values("t")
    values = pd.to_numeric(points[t.key], errors="coerce")
    reached = values <= t.value if TARGET_KEYS[t.key] == "lower" else values >= t.value
    hit = points.loc[reached.fillna(False), "t"]
    return float(hit.iloc[0]) if len(hit) else None


def time_to_target(curve: pd.DataFrame, claim: ClaimConfig, end: float) -> Value:
    """The first time the claim's target is reached (censored at `end` when never), with its
    caveats: reached at t = 0 (before any training: a trivial target), or followed by a
    blow-up (`blown_after`), which un-reaches it where the claim is about stable training."""
    hit = first_reached(curve, claim.target)
    if hit is None:
        return Value(float(end), censored=True)
    flags = {AT_ZERO: "reached the target at t = 0, before any training"} if hit <= 0 else {}
    after = blown_after(curve, claim.target, hit)
    if after:
        unreached = ": not reached (the claim is about stable training)" if claim.stable else ""
        flags[BLOW_UP] = f"reached the target at t={hit:g}, then {after}{unreached}"
        if claim.stable:
            return Value(float(end), censored=True, flags=flags)
    return Value(hit, flags=flags)


def blown_after(curve: pd.DataFrame, t: TargetConfig, hit: float) -> str | None:
    """How the target split's loss blew up after the target was reached at `hit`: above its
    first evaluation's (all the training undone, short of budget.diverge_factor, which makes
    the run diverged: `mark_blow_ups`); None when it stayed at or below it."""
    points = curve[curve["split"] == t.split].sort_values("t")
    loss = pd.to_numeric(points["loss"], errors="coerce")
    finite = loss[np.isfinite(loss)]
    if finite.empty:
        return None
    first = float(finite.iloc[0])
    later = (points.loc[finite.index, "t"] > hit) & (finite > first)
    if not later.any():
        return None
    i = later.idxmax()  # the first such evaluation
    x, at = float(finite[i]), float(points.loc[i, "t"])
    return f"{t.split} loss {x:.4g} at t={at:g}, above its first {first:.4g}"


def blown_up(row: dict, curve: pd.DataFrame) -> str | None:
    """Why a run diverged although its summary says otherwise: its held-out loss passed
    budget.diverge_factor × its first held-out loss at some evaluation (a blow-up after
    the target, or one it recovered from, which the runtime's end-of-run check misses);
    None when it never did (or the factor is 0: off)."""
    factor = row.get("budget.diverge_factor")
    factor = DIVERGE_FACTOR if factor is None or _nan(factor) else float(factor)
    if not factor or curve.empty:
        return None
    for split, points in curve[curve["split"] != "train"].groupby("split"):
        points = points.sort_values("t")
        loss = pd.to_numeric(points["loss"], errors="coerce")
        finite = loss[np.isfinite(loss)]
        if finite.empty:
            continue
        first = float(finite.iloc[0])
        past = points.loc[finite.index][finite > factor * first]
        if len(past):
            t, x = float(past["t"].iloc[0]), float(finite[past.index[0]])
            return (
                f"{split} loss {x:.4g} at t={t:g}, above budget.diverge_factor={factor:g} × "
                f"its first {first:.4g}"
            )
    return None


def mark_blow_ups(rows: list[dict], curves: pd.DataFrame) -> None:
    """A completed run whose held-out loss blew up (`blown_up`) is diverged, for every
    claim: its status becomes `diverged` and `diverged_why` says why."""
    by_run = dict(tuple(curves.groupby("run_dir"))) if not curves.empty else {}
    for row in rows:
        if row.get("status") == "completed" and row.get("run_dir") in by_run:
            why = blown_up(row, by_run[row["run_dir"]])
            if why:
                row["status"], row["diverged_why"] = "diverged", why


def _end(row: dict, curve: pd.DataFrame) -> float:
    """A run's end: summary.json's run_time_s (wall_time_s before it had one), else its last
    evaluation."""
    for key in ("run_time_s", "wall_time_s"):
        end = row.get(key)
        if end is not None and not _nan(end):
            return float(end)
    return float(curve["t"].max())


def metric(row: dict, claim: ClaimConfig, curves: pd.DataFrame) -> Value | None:
    """The claim's number for one run; None when the run is unusable for it (failed, timed
    out, without the metric, or diverged for anything but a time to target, which a
    diverged run never reaches: censored at its end)."""
    status = row.get("status")
    if status not in USABLE:
        return None
    if claim.metric == "time_to_target":
        curve = curves[curves["run_dir"] == row["run_dir"]]
        if "loss" not in curve or curve.empty:
            return None
        if status == "diverged":
            return Value(_end(row, curve), censored=True)
        return time_to_target(curve, claim, _end(row, curve))
    if status == "diverged":
        return None
    x = value(row, claim.metric, curves)
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else Value(x)


def value(row: dict, name: str, curves: pd.DataFrame) -> Any:
    """A run's summary value by its flattened key; a final accuracy, loss or perplexity
    (TAIL_METRICS) is the end of the curve: summary.json's `final_tail`, or, of a summary
    written before it had one, the same mean over the run's curve."""
    if name not in TAIL_METRICS:
        return row.get(name)
    if not _nan(row.get("final_tail_evals")):
        return row.get(f"final_tail_{TAIL_METRICS[name]}")
    curve = curves[curves["run_dir"] == row.get("run_dir")]
    split = row.get("eval_split")
    if not isinstance(split, str):  # the split summarize reads (stalebench.metrics.summary)
        split = "val" if (curve["split"] == "val").any() else "test"
    evals = curve[curve["split"] == split].sort_values(["t", "version"], kind="stable")
    tail = final_tail(evals.to_dict("records"))
    return (tail or {}).get(TAIL_METRICS[name])


def _nan(x: Any) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True

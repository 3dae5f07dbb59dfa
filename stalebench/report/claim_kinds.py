"""The claim kinds judged other than by one test of one statistic: `per` and `trend`
(joint tests over a key's values or steps), and the counts `diverges`, `fails` and
`reproduces` (every usable run or seed must agree; no test)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from stalebench.report.claim_metrics import USABLE, Value, _nan, value
from stalebench.report.claim_selection import select
from stalebench.report.claim_sides import _flag_notes, one_per_seed, side
from stalebench.report.claim_stats import (
    ONE,
    RESOLUTION,
    Test,
    _identical,
    _lose,
    _one_sided,
    _sign,
    _tolerance,
)
from stalebench.sweep import ClaimConfig


def _order(v: Any):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def _trend(
    claim: ClaimConfig, rows: list[dict], curves: pd.DataFrame, caveats: list[str]
) -> tuple[list[Test], list[str]]:
    """trend: at every consecutive step of `over`, per seed f(next) − f(this) with f = a's
    metric (minus b's), tested against the margin in the claim's direction; and the notes
    on its flagged seeds (their caveats added to `caveats`)."""
    levels = {r.get(claim.over) for r in select(rows, {**claim.where, **claim.a})} - {None}
    levels = sorted(levels, key=_order)
    if len(levels) < 2:
        return [], [f"needs two values of {claim.over}"]
    flagged: list[str] = []

    def f(level) -> tuple[dict[Any, Value], set, dict[Any, str], float]:
        """a's (or a − b's) value per seed at `level`, the seeds run there on every side,
        the lost ones (seed -> why) and the size of the values (for the tie tolerance)."""
        a = side(select(rows, {**claim.where, **claim.a, claim.over: level}), claim, curves)
        flagged.extend(_flag_notes(f"a at {claim.over}={level}", a, caveats))
        lost = {s: f"a at {claim.over}={level}: {why}" for s, why in a.unusable.items()}
        size = max((abs(v.x) for v in a.values.values()), default=0.0)
        if not claim.b:
            return a.values, a.seeds, lost, size
        b = side(select(rows, {**claim.where, **claim.b, claim.over: level}), claim, curves, "b")
        flagged.extend(_flag_notes(f"b at {claim.over}={level}", b, caveats))
        lost.update({s: f"b at {claim.over}={level}: {why}" for s, why in b.unusable.items()})
        size = max(size, *(abs(v.x) for v in b.values.values()), 0.0)
        values = {
            s: Value(v.x - b.values[s].x, v.censored or b.values[s].censored)
            for s, v in a.values.items()
            if s in b.values
        }
        return values, a.seeds & b.seeds, {s: w for s, w in lost.items() if s in b.seeds
                                             and s in a.seeds}, size  # fmt: skip

    curves_at = [f(level) for level in levels]
    what = "a − b" if claim.b else "a"
    tests = []
    for (lo, (f_lo, ran_lo, lost_lo, size_lo)), (hi, (f_hi, ran_hi, lost_hi, size_hi)) in zip(
        zip(levels, curves_at, strict=True),
        zip(levels[1:], curves_at[1:], strict=True),
        strict=False,
    ):
        seeds = sorted(set(f_lo) & set(f_hi), key=str)
        label = f"{what} at {claim.over}={hi} minus at {lo}"
        # a seed run at both steps but lost at one: the step can neither hold nor fail (a
        # trend's direction may run against the metric's: no side's worst is known)
        lost = [(s, -1, why) for s in sorted(ran_lo & ran_hi, key=str)
                for why in (lost_lo.get(s), lost_hi.get(s)) if why]  # fmt: skip
        if not seeds:
            empty = Test(label, 0, math.nan, math.nan, (math.nan,) * 2, claim.margin, 1.0,
                         "none", short=True)  # fmt: skip
            tests.append(_lose(claim, empty, lost))
            continue
        d = np.array([f_hi[s].x - f_lo[s].x for s in seeds])
        censored = any(f_lo[s].censored or f_hi[s].censored for s in seeds)
        tol = _tolerance(claim, [size_lo, size_hi])
        mean, ci, p, se, df = _one_sided(_sign(claim) * d, claim.margin, tol)
        tests.append(
            _lose(
                claim,
                Test(
                    label,
                    len(d),
                    float(d.mean()),
                    mean,
                    ci,
                    claim.margin,
                    p,
                    "paired t",
                    censored,
                    censored,
                    len(d) < claim.min_seeds,
                    se=se,
                    df=df,
                ),
                lost,
            )  # fmt: skip
        )
    return tests, flagged


def _count(claim: ClaimConfig, rows: list[dict], curves: pd.DataFrame) -> dict[str, Any]:
    """diverges / fails: counts over a's usable runs, not a test. fails: a run's final
    accuracy (its final_tail) ends within `value` of chance accuracy (a diverged run never
    trained: it fails too)."""
    runs = select(rows, {**claim.where, **claim.a})
    one_per_seed(runs, claim, "a")
    usable = [r for r in runs if r.get("status") in USABLE]
    notes = [f"seed {r.get('seed')}: {r.get('status')}" for r in runs if r not in usable]
    notes += [f"seed {r.get('seed')}: diverged ({r['diverged_why']})" for r in usable
              if r.get("diverged_why")]  # fmt: skip
    if claim.kind == "diverges":
        hits = [r.get("status") == "diverged" for r in usable]
        word = "diverged"
    else:
        acc = {id(r): value(r, "final_accuracy", curves) for r in usable}
        known = [
            r for r in usable
            if r.get("status") == "diverged"
            or not (_nan(acc[id(r)]) or _nan(r.get("chance_accuracy")))
        ]  # fmt: skip
        notes += [f"seed {r.get('seed')}: no final accuracy or chance" for r in usable
                  if r not in known]  # fmt: skip
        usable = known
        hits = [
            r.get("status") == "diverged"
            or float(acc[id(r)]) <= float(r["chance_accuracy"]) + claim.value
            for r in usable
        ]
        word = f"ended within {claim.value:g} of chance"
    n, k = len(usable), sum(hits)
    verdict = _tally(claim, len(runs), n, k, f"to have {word}", notes)
    return {"verdict": verdict, "ours": f"{k} of {n} runs {word}" if runs else "", "n": n,
            "notes": "; ".join(notes), "tests": []}  # fmt: skip


def _tally(claim: ClaimConfig, runs: int, n: int, k: int, word: str, notes: list[str]) -> str:
    """A count kind's verdict: `k` of the `n` usable of a's `runs` did what the claim says
    (`word`, for the note); holds when all did, does not hold when none did, inconclusive
    when some did, with fewer than min_seeds usable, or when all did but runs were lost
    (failed, timed out, no value: "every run" cannot be shown). Notes why in `notes`."""
    if not runs:
        return "not run"
    if n < claim.min_seeds:
        notes.append(f"{n} usable runs (min {claim.min_seeds})")
        return "inconclusive"
    if k == n and runs > n:
        notes.append(f"{runs - n} lost runs: every run of a cannot be shown {word}")
        return "inconclusive"
    return "holds" if k == n else "does not hold" if k == 0 else "inconclusive"


def _reproduces(claim: ClaimConfig, rows: list[dict], curves: pd.DataFrame) -> dict[str, Any]:
    """reproduces: each seed's number against the published one (`value`), as the ratio
    ours / theirs; a count of the seeds within `tolerance` of it, not a test. A seed's
    number is a's metric; with `b`, a's gain (or factor: `relative`) over b's run of the
    same seed; with `over`, its best over that key's values. A diverged, failed or
    unmeasured run has not run the paper's course: it measures nothing here, and loses its
    seed."""
    runs = select(rows, {**claim.where, **claim.a})
    points = [{}]
    if claim.over:
        found = {r.get(claim.over) for r in runs} - {None}
        points = [{claim.over: v} for v in sorted(found, key=_order)]
    numbers: dict[Any, list[float | None]] = {}  # seed -> its number at each point
    notes: list[str] = []

    def usable(row: dict | None, seed: Any, name: str, at: str) -> float | None:
        x = None if row is None else value(row, claim.metric, curves)
        if row is None:
            why = "no run"
        elif row.get("status") != "completed":
            why = row.get("status")
        elif _nan(x):
            why = f"completed, no {claim.metric}"
        else:
            return float(x)
        notes.append(f"{name} seed {seed}{at}: {why}" if claim.b else f"seed {seed}{at}: {why}")
        return None

    for k, point in enumerate(points):
        at = f" at {claim.over}={point[claim.over]}" if point else ""
        a = one_per_seed(select(runs, point), claim, "a")
        b = one_per_seed(select(rows, {**claim.where, **claim.b, **point}), claim, "b") if (
            claim.b) else {}  # fmt: skip
        for seed in a:
            numbers.setdefault(seed, [None] * len(points))
            x = usable(a[seed], seed, "a", at)
            if claim.b and x is not None:
                y = usable(b.get(seed), seed, "b", at)
                if y is not None and (y if claim.better == "higher" else x) == 0:
                    notes.append(f"seed {seed}{at}: a gain over 0 is undefined")
                    y = None
                factor = None if y is None else x / y if claim.better == "higher" else y / x
                x = factor - 1 if factor is not None and claim.relative == "gain" else factor
            numbers[seed][k] = x
    best = max if claim.better == "higher" or claim.b else min
    ours = {seed: best(xs) for seed, xs in numbers.items() if None not in xs}
    ratios = [x / claim.value for x in ours.values()]
    lo, hi = 1 / claim.tolerance, claim.tolerance
    n, k = len(ratios), sum(lo <= q <= hi for q in ratios)
    verdict = _tally(claim, len(numbers), n, k, "within the tolerance", notes)
    # deterministic seeds (bit-identical numbers) are one measurement, counted once
    once = _identical([Value(x) for x in ours.values()])
    shown = ""
    reproduced = {"paper": claim.value, "ours": None, "ratio": None, "tolerance": claim.tolerance}
    if ratios:
        mean = float(np.mean(list(ours.values())))
        reproduced.update(ours=mean, ratio=mean / claim.value)
        name = f"{claim.metric} {claim.relative} of a over b" if claim.b else claim.metric
        if claim.over:
            means = [np.mean([xs[j] for xs in numbers.values() if xs[j] is not None] or [np.nan])
                     for j in range(len(points))]  # fmt: skip
            where = ", ".join(
                f"{p[claim.over]}: {m:.3g}" for p, m in zip(points, means, strict=True)
            )
            name = f"the best {name} over {claim.over} ({where})"
        unit = "seeds" if claim.b or claim.over else "runs"  # a seed is one run of a alone
        spread = f" ({unit} {min(ratios):.3g} to {max(ratios):.3g})" if n > 1 and max(
            ratios) - min(ratios) > RESOLUTION * max(abs(q) for q in ratios) else ""  # fmt: skip
        count = (f"{ONE} ({n} {unit}, identical), {'within' if k else 'not within'} it"
                 if once else f"{k} of {n} {unit} within it")  # fmt: skip
        shown = (f"{name} {mean:.4g} against {claim.value:.4g}: ours / theirs "
                 f"{mean / claim.value:.3g}{spread}, tolerance ×{claim.tolerance:g}; "
                 f"{count}")  # fmt: skip
    return {"verdict": verdict, "ours": shown, "n": 1 if once else n, "notes": "; ".join(notes),
            "tests": [], "reproduced": reproduced, "caveats": [ONE] * once}  # fmt: skip

"""Judge a paper sweep's claims from its run directories.

Each claim (stalebench.sweep.ClaimConfig) names a metric, the runs it compares (selectors
on summary.json fields or dotted config keys) and a comparison. Over the seeds, a claim
becomes one number per seed, its *advantage*: how far the claimed inequality holds for
that seed (a's lead over b for an ordering, the margin to the bound for a ratio, a
threshold or a gap). Runs pair up by seed (same data order and draws), so the common seed
noise cancels; without two paired seeds the two sides' own spreads are combined.

The rule, stated once: with n seeds, mean advantage m and its sample std sd,
- **holds** when m > 0 and m > sd (the claimed ordering holds in the mean, by more than
  the seeds' spread: a one-sided paired t statistic above √n, p ≈ 0.11 at n = 3);
- **does not hold** when m ≤ 0 and |m| ≥ sd (the mean goes the other way, or ties, at least
  as clearly);
- **inconclusive** otherwise, or with fewer than two seeds;
- **not run** when a side has no completed (or diverged) run.
Time to target is censored at the run's end when the target is never reached; a censored
value is a lower bound, so it may not make a claim hold in its favour (a censored `a`
cannot give "holds", a censored `b` cannot give "does not hold").
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stalebench.sweep import TARGET_KEYS, ClaimConfig, claim_from_dict

VERDICTS = ("holds", "does not hold", "inconclusive", "not run")
USABLE = ("completed", "diverged")  # a failed or timed-out run measures nothing
RULE = (
    "per seed, the claim's advantage (a's lead over b, or the margin to the bound); "
    "holds: mean > 0 and mean > sample std over seeds; does not hold: mean <= 0 and "
    "|mean| >= std; otherwise inconclusive (also with < 2 seeds); not run: a side has no "
    "completed or diverged run. Runs pair by seed; unpaired sides combine their stds."
)


def load_config(run_dir: str | Path) -> dict[str, Any]:
    """A run's config (.hydra/config.yaml) as plain data, interpolations such as
    `${sweep.params.target}` resolved; {} when absent."""
    from omegaconf import OmegaConf  # Hydra's config library; no torch, no engine code

    path = Path(run_dir) / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    config = OmegaConf.load(path)
    try:
        return OmegaConf.to_container(config, resolve=True) or {}
    except Exception:  # an interpolation only Hydra's runtime can resolve: leave them all
        return OmegaConf.to_container(config, resolve=False) or {}


def _dotted(obj: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.update(_dotted(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def claim_rows(runs: pd.DataFrame) -> tuple[list[dict], dict[str, dict]]:
    """One dict per run (summary fields + dotted config keys, e.g. `algorithm.barrier.staleness`)
    and the sweeps found in the runs' configs: name -> {paper, scale, claims}."""
    rows, sweeps = [], {}
    for run in runs.to_dict("records"):
        config = load_config(run["run_dir"])
        sweep = config.get("sweep") or {}
        name = sweep.get("name") or ""
        if name and name not in sweeps:
            sweeps[name] = {
                "paper": sweep.get("paper", ""),
                "scale": sweep.get("scale", ""),
                "claims": [
                    claim_from_dict(c, f"sweep {name}: claims[{i}]")
                    for i, c in enumerate(sweep.get("claims") or [])
                ],
            }
        dotted = {k: v for k, v in _dotted(config).items() if "." in k and k != "sweep.claims"}
        rows.append({**dotted, **run, "sweep": name})
    return rows, sweeps


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, list | tuple):
        return any(_same(have, w) for w in want)
    try:
        return float(have) == float(want)
    except (TypeError, ValueError):
        return str(have) == str(want)


def select(rows: list[dict], selector: dict[str, Any]) -> list[dict]:
    return [r for r in rows if all(_same(r.get(k), v) for k, v in selector.items())]


@dataclasses.dataclass
class Value:
    x: float
    censored: bool = False  # time to target never reached: x is the run's end, a lower bound


def time_to_target(curve: pd.DataFrame, claim: ClaimConfig, end: float) -> Value:
    t = claim.target
    points = curve[curve["split"] == t.split].sort_values("t")
    values = pd.to_numeric(points[t.key], errors="coerce")
    reached = values <= t.value if TARGET_KEYS[t.key] == "lower" else values >= t.value
    hit = points.loc[reached.fillna(False), "t"]
    if len(hit):
        return Value(float(hit.iloc[0]))
    return Value(float(end), censored=True)


def metric(row: dict, claim: ClaimConfig, curves: pd.DataFrame) -> Value | None:
    if claim.metric == "time_to_target":
        curve = curves[curves["run_dir"] == row["run_dir"]]
        if "loss" not in curve:
            return None
        end = row.get("wall_time_s")
        end = float(end) if end is not None and not _nan(end) else float(curve["t"].max())
        return time_to_target(curve, claim, end)
    x = row.get(claim.metric)
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else Value(x)


def _nan(x: Any) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return True


@dataclasses.dataclass
class Side:
    """The selected runs of one side of a claim, by seed."""

    values: dict[Any, Value]
    runs: int  # selected runs, any status
    unusable: int  # failed or timed out (or without the metric)

    @property
    def xs(self) -> np.ndarray:
        return np.array([v.x for v in self.values.values()], dtype=float)

    def describe(self) -> str:
        xs = self.xs
        if not len(xs):
            return "no run"
        cens = sum(v.censored for v in self.values.values())
        sd = f" ± {np.std(xs, ddof=1):.4g}" if len(xs) > 1 else ""
        note = f", {cens} never reached" if cens else ""
        return f"{np.mean(xs):.4g}{sd} (n={len(xs)}{note})"


def side(rows: list[dict], claim: ClaimConfig, curves: pd.DataFrame) -> Side:
    values, unusable = {}, 0
    for row in rows:
        v = metric(row, claim, curves) if row.get("status") in USABLE else None
        if v is None:
            unusable += 1
        else:
            values[row.get("seed")] = v
    return Side(values, len(rows), unusable)


def rule(m: float, sd: float, n: int) -> str:
    """The verdict from the mean advantage m, its spread sd and the number of seeds n."""
    if n == 0 or math.isnan(m):
        return "not run"
    if n < 2 or math.isnan(sd):
        return "inconclusive"
    if m > 0 and m > sd:
        return "holds"
    if m <= 0 and -m >= sd:
        return "does not hold"
    return "inconclusive"


def verdict(advantages: list[float]) -> str:
    a = np.asarray(advantages, dtype=float)
    if not len(a):
        return "not run"
    return rule(float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else math.nan, len(a))


def _censor(result: str, a_censored: bool, b_censored: bool) -> str:
    if result == "holds" and a_censored:
        return "inconclusive"
    if result == "does not hold" and b_censored:
        return "inconclusive"
    return result


def _sign(claim: ClaimConfig) -> float:
    return 1.0 if claim.better == "higher" else -1.0


def _statistic(claim: ClaimConfig, vals: list[float]) -> float:
    """The claim's number for one seed: a − b, a / b, a, or (a − b) / (c − b)."""
    if claim.kind == "ordering":
        return vals[0] - vals[1]
    if claim.kind == "ratio":
        return vals[0] / vals[1] if vals[1] else math.nan
    if claim.kind == "threshold":
        return vals[0]
    span = vals[2] - vals[1]  # gap_closed
    return (vals[0] - vals[1]) / span if span else math.nan


def _bound(claim: ClaimConfig) -> float:
    return 0.0 if claim.kind == "ordering" else claim.value


@dataclasses.dataclass
class Outcome:
    m: float  # mean advantage
    sd: float  # its spread (NaN with one seed)
    n: int  # seeds
    shown: str  # the statistic as mean ± std, for the table
    a_censored: bool = False
    b_censored: bool = False


def _names(claim: ClaimConfig) -> str:
    return {"ordering": "a − b", "ratio": "a / b", "threshold": "a"}.get(
        claim.kind, "(a − b) / (c − b)"
    )


def _outcome(claim: ClaimConfig, sides: list[Side]) -> Outcome:
    """Paired by seed when at least two seeds pair up (threshold: a's seeds); otherwise the
    sides' means, with their stds combined as the spread of the statistic."""
    sign, bound, a, rest = _sign(claim), _bound(claim), sides[0], sides[1:]
    seeds = sorted(a.values, key=str)
    if claim.kind != "threshold":
        seeds = [s for s in seeds if all(s in r.values for r in rest)]
    if claim.kind == "threshold" or len(seeds) >= 2:
        stats = [_statistic(claim, [side.values[s].x for side in sides]) for s in seeds]
        pairs = [(s, x) for s, x in zip(seeds, stats, strict=True) if not math.isnan(x)]
        xs = np.array([x for _, x in pairs])
        n = len(xs)
        sd = float(np.std(xs, ddof=1)) if n > 1 else math.nan
        m = sign * (float(xs.mean()) - bound) if n else math.nan
        shown = (
            f"{_names(claim)} = {xs.mean():.4g}" + (f" ± {sd:.3g}" if n > 1 else "") if n else ""
        )
        used = [s for s, _ in pairs]
        return Outcome(
            m,
            sd,
            n,
            shown,
            any(a.values[s].censored for s in used),
            any(r.values[s].censored for r in rest for s in used),
        )
    means = [float(s.xs.mean()) for s in sides]
    stds = [float(np.std(s.xs, ddof=1)) if len(s.xs) > 1 else math.nan for s in sides]
    x = _statistic(claim, means)
    if claim.kind == "ordering":
        sd = math.sqrt(sum(v * v for v in stds))
    else:  # a ratio or a fraction: first-order propagation of the relative spreads
        sd = abs(x) * math.sqrt(sum((v / mu) ** 2 for v, mu in zip(stds, means, strict=True) if mu))
    n = min(len(s.xs) for s in sides)
    shown = f"{_names(claim)} = {x:.4g} ± {sd:.3g} (unpaired)" if not math.isnan(x) else ""
    return Outcome(
        sign * (x - bound),
        sd,
        n,
        shown,
        any(v.censored for v in a.values.values()),
        any(v.censored for r in rest for v in r.values.values()),
    )


def _trend(claim: ClaimConfig, rows: list[dict], curves) -> tuple[list[float], str, str]:
    """trend: per seed, f(largest `over`) − f(smallest), f = a's metric (minus b's)."""
    levels = sorted({r.get(claim.over) for r in select(rows, {**claim.where, **claim.a})} - {None})
    if len(levels) < 2:
        return [], "", f"needs two values of {claim.over}"
    lo, hi = levels[0], levels[-1]

    def f(level) -> dict:
        a = side(select(rows, {**claim.where, **claim.a, claim.over: level}), claim, curves)
        out = {s: v.x for s, v in a.values.items() if not v.censored}
        if claim.b:
            b = side(select(rows, {**claim.where, **claim.b, claim.over: level}), claim, curves)
            out = {s: x - b.values[s].x for s, x in out.items() if s in b.values}
        return out

    f_lo, f_hi = f(lo), f(hi)
    seeds = sorted(set(f_lo) & set(f_hi), key=str)
    adv = [_sign(claim) * (f_hi[s] - f_lo[s]) for s in seeds]
    what = "a − b" if claim.b else "a"
    shown = ""
    if adv:
        xs = np.array([f_hi[s] - f_lo[s] for s in seeds])
        sd = f" ± {np.std(xs, ddof=1):.3g}" if len(xs) > 1 else ""
        shown = f"{what} at {claim.over}={hi} minus at {lo} = {xs.mean():.3g}{sd}"
    return adv, shown, ""


def _diverges(claim: ClaimConfig, rows: list[dict]) -> dict[str, Any]:
    """Every completed-or-diverged run of a diverged: holds; none did: does not hold."""
    statuses = [r.get("status") for r in select(rows, {**claim.where, **claim.a})]
    statuses = [s for s in statuses if s in USABLE]
    n_div = sum(s == "diverged" for s in statuses)
    if not statuses:
        result = "not run"
    elif n_div in (0, len(statuses)):
        result = "holds" if n_div else "does not hold"
    else:
        result = "inconclusive"
    shown = f"{n_div} of {len(statuses)} runs diverged" if statuses else ""
    return {"verdict": result, "ours": shown, "n": len(statuses), "notes": ""}


def judge(claim: ClaimConfig, rows: list[dict], curves: pd.DataFrame) -> dict[str, Any]:
    """One claim over the rows of its sweep (already restricted to one `per` value)."""
    if claim.kind == "diverges":
        return _diverges(claim, rows)
    if claim.kind == "trend":
        adv, shown, note = _trend(claim, rows, curves)
        return {"verdict": verdict(adv), "ours": shown, "n": len(adv), "notes": note}
    keys = ["a", "b", "c"][: {"ordering": 2, "ratio": 2, "gap_closed": 3}.get(claim.kind, 1)]
    sides = [side(select(rows, {**claim.where, **getattr(claim, k)}), claim, curves) for k in keys]
    named = list(zip(keys, sides, strict=True))
    notes = [f"{k}: {s.unusable} of {s.runs} runs unusable" for k, s in named if s.unusable]
    out: dict[str, Any] = {"sides": {k: s.describe() for k, s in named}}
    if any(not s.values for s in sides):
        notes += [f"{k}: no run" for k, s in named if not s.values]
        return {**out, "verdict": "not run", "ours": "", "n": 0, "notes": "; ".join(notes)}
    o = _outcome(claim, sides)
    result = _censor(rule(o.m, o.sd, o.n), o.a_censored, o.b_censored)
    if claim.kind == "gap_closed" and (o.a_censored or o.b_censored) and result != "not run":
        result = "inconclusive"  # a lower bound inside a fraction bounds nothing
    return {**out, "verdict": result, "ours": o.shown, "n": o.n, "notes": "; ".join(notes)}


def evaluate(runs: pd.DataFrame, curves: pd.DataFrame) -> list[dict[str, Any]]:
    """Every claim of every sweep found under the runs, one dict per (claim, per-value)."""
    if runs.empty:
        return []
    rows, sweeps = claim_rows(runs)
    results = []
    for name, sweep in sweeps.items():
        mine = [r for r in rows if r["sweep"] == name]
        for claim in sweep["claims"]:
            scopes: list[dict[str, Any]] = [{}]
            if claim.per:
                found = {r.get(claim.per) for r in select(mine, {**claim.where, **claim.a})}
                scopes = [{claim.per: v} for v in sorted(found - {None}, key=_order)] or [{}]
            for scope in scopes:
                c = dataclasses.replace(claim, where={**claim.where, **scope})
                result = judge(c, mine, curves)
                results.append(
                    {
                        "sweep": name,
                        "paper": sweep["paper"],
                        "scale": sweep["scale"],
                        "id": claim.id,
                        "text": claim.text,
                        "scope": ", ".join(f"{k}={v}" for k, v in c.where.items()),
                        "metric": claim.metric
                        + (
                            f" ({claim.target.split} {claim.target.key} "
                            f"{'<=' if TARGET_KEYS[claim.target.key] == 'lower' else '>='} "
                            f"{claim.target.value})"
                            if claim.target
                            else ""
                        ),
                        "kind": claim.kind,
                        "published": claim.published,
                        "source": claim.source,
                        **result,
                    }
                )
    return results


def _order(v: Any):
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(v))


def table(results: list[dict[str, Any]], sweep: str) -> pd.DataFrame:
    """One sweep's verdicts as display rows: claim, scope, published, ours, verdict."""
    rows = [r for r in results if r["sweep"] == sweep]
    return pd.DataFrame(
        {
            "claim": [f"**{r['id']}**: {r['text']}" for r in rows],
            "where": [r["scope"] or "all runs" for r in rows],
            "metric": [r["metric"] for r in rows],
            "published": [
                " ".join(
                    x for x in (r["published"], f"[{r['source']}]" if r["source"] else "") if x
                )
                or "—"
                for r in rows
            ],
            "ours": [
                "; ".join(
                    [*(f"{k}: {v}" for k, v in (r.get("sides") or {}).items()), r["ours"]]
                ).strip("; ")
                or "—"
                for r in rows
            ],
            "verdict": [r["verdict"] + (f" ({r['notes']})" if r["notes"] else "") for r in rows],
        }
    )

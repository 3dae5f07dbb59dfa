"""A judged claim as the record a report and results/<sweep>/claims.json keep (`evaluate`:
every claim of every sweep under the runs), and its presentation: the tally line and the
verdict tables of `stalebench-report` and docs/results.md."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from stalebench.report.claim_judge import TESTED, VERDICTS, _sequential, _sweeps
from stalebench.report.claim_stats import Test
from stalebench.sweep import ALPHA, TARGET_KEYS, ClaimConfig

# whose a claim's value and margin are (`threshold_from`), as a table says it
WHOSE = {"ours": "ours", "paper": "the paper's"}


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _side(selector: dict[str, Any]) -> str:
    """A side as its selector names it: the value of its one key (SSP(3)), else k=v, ..."""
    if len(selector) == 1:
        return str(next(iter(selector.values())))
    return ", ".join(f"{k}={v}" for k, v in selector.items()) or "?"


def _named(claim: ClaimConfig) -> str:
    """The claim's statistic with its sides named: SSP(3) − BSP, SSP(3) / BSP, ..."""
    a, b, c = (_side(s) for s in (claim.a, claim.b, claim.c))
    return {"ordering": f"{a} − {b}", "ratio": f"{a} / {b}", "threshold": a}.get(
        claim.kind, f"({a} − {b}) / ({c} − {b})"
    )


def _unit(claim: ClaimConfig) -> str:
    """The unit of the claim's statistic, as shown after a number: seconds for a time, none
    for a ratio, a fraction of a gap, an accuracy or a loss."""
    if claim.kind in ("ratio", "gap_closed"):
        return ""
    m = claim.metric
    if m.endswith("_per_s"):
        return " /s"
    if m == "time_to_target" or m.endswith("_s"):
        return " s"
    return " B" if m.startswith("bytes") else ""


def _shown(claim: ClaimConfig, tests: list[Test]) -> str:
    """The claim's verdict line(s), prefixed by its metric."""
    unit = _unit(claim)
    if len(tests) == 1 and not (claim.per or claim.kind == "trend"):
        return f"{claim.metric}: {tests[0].shown(_named(claim), unit)}"
    return f"{claim.metric}: " + "; ".join(
        f"{t.label}: {t.shown(_named(claim) if claim.per else 'Δ', unit)}" for t in tests
    )


def evaluate(
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    configs: Mapping[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every claim of every sweep found under the runs, one dict per claim, with its test,
    p value and Holm-adjusted p (over the sweep's paper and recalled claims; self-checks
    are a family of their own). Raises ClaimError for a claim these runs cannot judge.
    `configs`: the runs' configs already read (claim_rows), else read from their
    directories."""
    if runs.empty:
        return []
    return [
        _result(name, sweep, claim, j)
        for name, sweep, mine in _sweeps(runs, curves, configs)
        for claim, j in _sequential(sweep, mine, curves)
    ]


def _result(name: str, sweep: dict, claim: ClaimConfig, j: dict[str, Any]) -> dict[str, Any]:
    tests: list[Test] = j.pop("tests")
    single = tests[0] if len(tests) == 1 else None
    verdict = j["verdict"]  # every claim is decided at some look (_sequential)
    target = claim.target
    mde = j.get("mde")
    return {
        "sweep": name,
        "paper": sweep["paper"],
        "scale": sweep["scale"],
        "id": claim.id,
        "text": claim.text,
        "scope": ", ".join(
            [f"{k}={v}" for k, v in claim.where.items()]
            + ([f"every {claim.per}"] if claim.per else [])
            + ([f"every step of {claim.over}"] if claim.kind == "trend" else [])
            + ([f"a's {claim.relative} over b"] if claim.kind == "reproduces" and claim.b else [])
            + ([f"best over {claim.over}"] if claim.kind == "reproduces" and claim.over else [])
        ),
        "metric": claim.metric
        + (
            f" ({target.split} {target.key} "
            f"{'<=' if TARGET_KEYS[target.key] == 'lower' else '>='} {target.value})"
            if target
            else ""
        ),
        "kind": claim.kind,
        "origin": claim.origin,
        "threshold_from": claim.threshold_from,
        "margin": claim.margin,
        "min_seeds": claim.min_seeds,
        "published": claim.published,
        "source": claim.source,
        "verdict": verdict,
        "ours": j["ours"] or (_shown(claim, tests) if tests else ""),
        "n": j["n"],  # distinct measurements: 1 for deterministic seeds
        "notes": j["notes"],
        # short caveats beside the verdict (BLOW_UP, AT_ZERO, ONE), each detailed in notes
        "caveats": j.get("caveats", []),
        "sides": j.get("sides", {}),
        "test": ", ".join(dict.fromkeys(t.test for t in tests)) if tests else "count",
        # why Welch's unpaired test rather than the paired one ("" when paired or a count)
        "test_why": "; ".join(dict.fromkeys(t.why for t in tests if t.why)),
        # the Holm family of the look that decided it (None: a count, in no family)
        "family": j.get("holm_family") if tests else None,
        "estimate": _finite(single.estimate) if single else None,
        "ci_low": _finite(single.ci[0]) if single else None,
        "ci_high": _finite(single.ci[1]) if single else None,
        "p": _finite(max(t.p for t in tests)) if tests else None,
        "p_holm": _finite(j.get("p_holm")) if tests else None,
        # the look it was decided at (or last judged), of how many, at what α; the mean
        # advantage its test detects with 80 % power there (None: a count, or no spread)
        "look": j.get("look", 1),
        "looks": j.get("looks", 1),
        "alpha": j.get("alpha", ALPHA),
        "mde": _finite(mde) if mde is not None else None,
        # reproduces: the published number, ours (the seeds' mean), ours / theirs (None
        # with no usable seed), the tolerance; None for the other kinds
        "reproduced": j.get("reproduced"),
        "steps": [
            {
                "label": t.label,
                "n": t.measurements,
                "estimate": _finite(t.estimate),
                "advantage": _finite(t.mean),
                "ci_low": _finite(t.ci[0]),
                "ci_high": _finite(t.ci[1]),
                "against": t.against,
                "p": _finite(t.p),
            }
            for t in tests
        ]
        if len(tests) > 1
        else [],  # fmt: skip
    }


def tally(results: list[dict[str, Any]], sweep: str) -> str:
    """A sweep's verdict counts, the paper's claims (paper and recalled) apart from the
    harness's self-checks."""
    parts = []
    for title, family in (("paper", TESTED), ("self-checks", ("self-check",))):
        counts = {k: 0 for k in VERDICTS}
        for r in results:
            if r["sweep"] == sweep and r["origin"] in family:
                counts[r["verdict"]] += 1
        if sum(counts.values()):
            parts.append(f"{title}: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n))
    return "; ".join(parts) or "no claims"


def _p(r: dict[str, Any]) -> str:
    """p (Holm's p, over its family where the file records it: how many claims, at which
    look, and how many of them carried from an earlier look)."""
    if r["p"] is None:
        return "—"
    holm = "—" if r["p_holm"] is None else f"{r['p_holm']:.2g}"  # null in a hand-edited file
    return f"{r['p']:.2g} (Holm {holm}{_family(r.get('family'))})"


def _family(family: dict[str, Any] | None) -> str:
    """` over 7 at look 3, 6 from earlier looks (6 held: p 0; the rest p 1)`: the Holm family
    a verdict was decided in; "" when the file does not record it (written before)."""
    if not family:
        return ""
    ids, carried = family.get("ids") or [], family.get("carried") or {}
    text = f" over {len(ids)}" + (f" at look {family['look']}" if family.get("look", 1) > 1 else "")
    if carried:
        held = sum(p == 0 for p in carried.values())
        text += f", {len(carried)} from earlier looks ({held} held: p 0; the rest p 1)"
    return text


def _seeds(r: dict[str, Any]) -> str:
    """A claim's seeds, the look it was decided at (of how many, at what α) and its
    minimum detectable effect there (80 % power), where the file records them."""
    n = r.get("n")
    parts = [f"n = {n}" if n is not None else "—"]
    if r.get("looks", 1) > 1:
        parts.append(f"look {r['look']} of {r['looks']} (α {r['alpha']:.2g})")
    if r.get("mde") is not None:
        parts.append(f"MDE {r['mde']:.3g}")
    return "; ".join(parts)


def _verdict(r: dict[str, Any]) -> str:
    """The verdict, its caveats in bold where the file records them, and its notes."""
    caveats = "; ".join(f"**{c}**" for c in r.get("caveats") or [])
    return r["verdict"] + (f" ({caveats})" if caveats else "") + (
        f" ({r['notes']})" if r["notes"] else "")  # fmt: skip


def published_table(results: list[dict[str, Any]], sweep: str) -> pd.DataFrame | None:
    """A sweep's `reproduces` claims side by side with the papers' numbers: paper, ours,
    ours / paper, the tolerance and the verdict; None when it has none."""
    rows = [r for r in results if r["sweep"] == sweep and r.get("kind") == "reproduces"]
    if not rows:
        return None
    got = [r.get("reproduced") or {} for r in rows]

    def cell(x: Any, form: str) -> str:  # a time in seconds with its thousands, not 1.8e+04
        return "—" if x is None else f"{x:,.0f}" if abs(x) >= 1000 else format(x, form)

    return pd.DataFrame(
        {
            "claim": [r["id"] for r in rows],
            "metric": [r["metric"] + (f" ({r['scope']})" if r["scope"] else "") for r in rows],
            "paper": [cell(g.get("paper"), ".4g") for g in got],
            "ours": [cell(g.get("ours"), ".4g") for g in got],
            "ours / paper": [cell(g.get("ratio"), ".3g") for g in got],
            "tolerance": [f"×{g['tolerance']:g}" if g.get("tolerance") else "—" for g in got],
            "verdict": [r["verdict"] for r in rows],
        }
    )


def table(results: list[dict[str, Any]], sweep: str) -> pd.DataFrame:
    """One sweep's verdicts as display rows: claim, origin and margin, scope, published,
    ours, p, verdict."""
    rows = [r for r in results if r["sweep"] == sweep]
    return pd.DataFrame(
        {
            "claim": [f"**{r['id']}**: {r['text']}" for r in rows],
            "origin": [
                f"{r['origin']}; margin {r['margin']:g} ({WHOSE[r['threshold_from']]})"
                for r in rows
            ],
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
            "p (one-sided)": [_p(r) for r in rows],
            "seeds": [_seeds(r) for r in rows],
            "verdict": [_verdict(r) for r in rows],
        }
    )

"""Judge a claim, and a sweep's claims look by look (Holm families, sequential looks).

Each claim (stalebench.sweep.ClaimConfig) names a metric, the runs it compares (selectors
on summary.json fields or dotted config keys) and a comparison. Over the seeds, a claim
becomes one number per seed, its *advantage* d: how far the claimed inequality holds for
that seed (a's lead over b for an ordering, the margin to the bound for a ratio, a
threshold or a gap), signed so that larger is better for the claim. Runs pair by seed
(same data order and draws), so the common seed noise cancels.

The rule, stated once (RULE below says it in one line):
- the test: one-sided t-test of H0 "mean advantage ≤ the claim's margin" — one-sample on
  the paired per-seed advantages (scipy.stats.ttest_1samp), Welch's unequal-variance test
  when the sides share no seed (a linear contrast of the sides' means);
- Holm's step-down correction at α = 0.05 over the claims of one sweep whose origin is the
  paper or a recalled statement; the harness's self-checks are a family of their own;
- **holds**: the Holm-adjusted p < α (the advantage exceeds the margin, significantly);
  **does not hold**: the 95 % interval of the mean advantage lies entirely below the
  margin; **inconclusive** otherwise, and whenever fewer than `min_seeds` seeds are usable
  on every side (the missing or failed seeds are named); **not run**: a side has no run;
- a time to target never reached is censored at the run's end (a lower bound): a censored
  `a` cannot make a claim hold, a censored `b` cannot make it fail. A diverged run never
  reaches a target, and is unusable for any other metric; a failed or timed-out run
  measures nothing and never counts as diverged;
- a final accuracy, loss or perplexity (`final_accuracy`, ...) is the end of the curve,
  summary.json's `final_tail` (the mean over the last 10 % of the held-out evaluations),
  not the last snapshot (`final`), which one batch's summation order can move;
- `per` (e.g. "at every N") is one joint verdict: holds when every value holds (its p the
  largest of theirs: an intersection-union test), does not hold when any value does not;
  `trend` is tested at every consecutive step of `over` the same way;
- `diverges` and `fails` are counts, not tests: holds when every usable run of `a` (at
  least `min_seeds`) diverged / ended within `value` of chance accuracy, does not hold when
  none did;
- `reproduces` is a count too: holds when every usable seed's number (at least
  `min_seeds`) lands within the claim's `tolerance` of the published number (ours / theirs
  in [1 / tolerance, tolerance], a tolerance of at most ×2), does not hold when none does,
  inconclusive when some do; the number is a's metric, or with `b` a's gain over b
  (`relative: factor`: the factor a / b, a published speed-up), and with `over` its best
  over that key's values (a published "as much as");
- seeds whose numbers are bit-identical (every side's, or every seed's `reproduces` number:
  deterministic runs, e.g. cost-only ones) are **one measurement**: n = 1, and the verdict
  says so; it still needs `min_seeds` seeds run, which is what shows they agree;
- a target reached at t = 0 (before any training) is flagged; a run whose held-out loss on
  the target's split passes its first evaluation's after it reached the target (a blow-up
  the diverge factor did not catch) is flagged, and where the claim is `stable` (about
  stable training) it has not reached the target: censored at its end;
- Welch's test is named in the notes with why (the sides share no seed); each tested
  claim records its Holm family: the look that decided it and the claims corrected with it
  there, those decided at an earlier look entering with p 0 (held) or 1 (did not hold).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from stalebench.report.claim_kinds import _count, _order, _reproduces, _trend
from stalebench.report.claim_metrics import mark_blow_ups
from stalebench.report.claim_selection import claim_rows, select
from stalebench.report.claim_sides import _flag_notes, side
from stalebench.report.claim_stats import ONE, Test, _lost_notes, compare
from stalebench.sweep import ALPHA, ClaimConfig, SequentialConfig

CORRECTION = "holm"
VERDICTS = ("holds", "does not hold", "inconclusive", "not run")
TESTED = ("paper", "recalled")  # the origins in a paper's family (and tally)
RULE = (
    "per seed, the claim's advantage (a's lead over b, or the margin to the bound); "
    "one-sided t-test of mean advantage > the claim's margin (paired by seed; Welch when "
    f"the sides share no seed), alpha = {ALPHA} with Holm's correction over a sweep's paper "
    "and recalled claims (self-checks apart); holds: adjusted p < alpha; does not hold: the "
    "95% interval lies below the margin; inconclusive otherwise or with fewer than "
    "min_seeds usable seeds; `per` and `trend` steps joint (every one must hold); a "
    "diverged run never reaches a target and is unusable for other metrics; a final "
    "accuracy or loss is the mean over the last 10% of the evaluations (final_tail); "
    "`reproduces`: every usable seed's number (a's metric, or a's gain or factor over b; "
    "with `over`, its best over that key's values) within the claim's tolerance of the "
    "published number, as the ratio ours / theirs, tolerance at most x2 (a count, not a "
    "test); seeds with bit-identical numbers are one measurement (n = 1); a target met at "
    "t = 0, or reached before the held-out loss rose above its first, is flagged, and with "
    "`stable` the latter is not reached."
)


def judge(claim: ClaimConfig, rows: list[dict], curves: pd.DataFrame) -> dict[str, Any]:
    """One claim over the rows of its sweep: a verdict for the count kinds; for the others
    the tests (one, one per `per` value, or one per `trend` step) that `decide` turns into a
    verdict once the sweep's p values are corrected."""
    if claim.kind in ("diverges", "fails"):
        return _count(claim, rows, curves)
    if claim.kind == "reproduces":
        return _reproduces(claim, rows, curves)
    caveats: list[str] = []
    if claim.kind == "trend":
        tests, notes = _trend(claim, rows, curves, caveats)
        if not tests:
            return {"verdict": "not run", "ours": "", "n": 0, "notes": notes[0], "tests": []}
        notes += _lost_notes(claim, tests)
        return {"verdict": None, "ours": "", "n": min(t.measurements for t in tests),
                "notes": "; ".join(notes), "tests": tests,
                "caveats": list(dict.fromkeys(caveats))}  # fmt: skip
    keys = ["a", "b", "c"][: {"ordering": 2, "ratio": 2, "gap_closed": 3}.get(claim.kind, 1)]
    scopes: list[dict[str, Any]] = [{}]
    if claim.per:
        found = {r.get(claim.per) for r in select(rows, {**claim.where, **claim.a})} - {None}
        if not found:
            return {"verdict": "not run", "ours": "", "n": 0, "tests": [],
                    "notes": f"a: no run with a value of {claim.per}"}  # fmt: skip
        scopes = [{claim.per: v} for v in sorted(found, key=_order)]
    tests, notes, shown_sides = [], [], {}
    for scope in scopes:
        where = {**claim.where, **scope}
        label = ", ".join(f"{k}={v}" for k, v in scope.items())
        sides = [side(select(rows, {**where, **getattr(claim, k)}), claim, curves, k) for k in keys]
        named = list(zip(keys, sides, strict=True))
        at = f" at {label}" if label else ""
        for k, s in named:
            for seed, why in s.unusable.items():
                notes.append(f"{k}{at}: seed {seed} unusable ({why})")
            notes += _flag_notes(f"{k}{at}", s, caveats)
            shown_sides[f"{k}{at}"] = s.describe()
        if any(not s.values for s in sides):
            missing = [k for k, s in named if not s.values]
            if not claim.per:
                notes += [f"{k}: no usable run" for k in missing]
                return {"verdict": "not run", "ours": "", "n": 0, "notes": "; ".join(notes),
                        "tests": [], "sides": shown_sides}  # fmt: skip
            notes += [f"{k}{at}: no usable run" for k in missing]
            tests.append(Test(label, 0, math.nan, math.nan, (math.nan,) * 2, claim.margin, 1.0,
                              "none", short=True))  # fmt: skip
            continue
        test = compare(claim, sides, label)
        if test.why:
            notes.append(f"Welch's test{at}, not paired: {test.why}")
        if test.once:
            notes.append(f"{ONE}{at}: the {test.n} seeds' numbers are identical on every side")
            caveats.append(ONE)
        tests.append(test)
    for t in tests:
        if t.short and t.n:
            notes.append(f"{t.label or 'claim'}: {t.n} usable seeds (min {claim.min_seeds})")
    notes += _lost_notes(claim, tests)
    return {"verdict": None, "ours": "", "n": min(t.measurements for t in tests),
            "notes": "; ".join(notes), "tests": tests, "sides": shown_sides,
            "caveats": list(dict.fromkeys(caveats))}  # fmt: skip


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p values (the family-wise error rate ≤ α when each
    adjusted p is compared with α)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [1.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def decide(tests: list[Test], p_adjusted: float, alpha: float = ALPHA) -> str:
    """A claim's verdict from its tests (all must hold: an intersection-union test, whose
    p is the largest of theirs, Holm-adjusted) at a look of level `alpha`."""
    if not tests:
        return "not run"
    if any(t.fails_at(alpha) for t in tests):
        return "does not hold"
    if p_adjusted < alpha and all(t.can_hold for t in tests):
        return "holds"
    return "inconclusive"


def look(row: dict) -> int:
    """The look a run's seed belongs to (`sweep.look`, set by the sweeper on a later
    look's runs; 1 for the sweep's own seeds)."""
    try:
        return max(1, int(row.get("sweep.look") or 1))
    except (TypeError, ValueError):
        return 1


def involved(claim: ClaimConfig, rows: list[dict]) -> list[dict]:
    """The rows any side of a claim selects."""
    picked: dict[int, dict] = {}
    for key in ("a", "b", "c"):
        selector = getattr(claim, key)
        if selector:
            picked.update((id(r), r) for r in select(rows, {**claim.where, **selector}))
    return list(picked.values())


def schedule(sequential: SequentialConfig, rows: list[dict]) -> list[tuple[int, float]]:
    """The sweep's looks, (seeds, α) each, from the seeds of its own runs (look 1)."""
    first = len({r.get("seed") for r in rows if look(r) == 1})
    return sequential.looks(first)


def _sequential(sweep: dict, mine: list[dict], curves: pd.DataFrame) -> list[tuple]:
    """Every claim of one sweep judged look by look (SequentialConfig): at look k a claim
    still open is judged on the runs of looks 1..k if its arms got seeds at look k; Holm
    over each family at that look's α, a claim decided earlier entering with p 0 (held) or
    1 (did not hold), one not judged again with p 1. (claim, its last judgement) each; a
    claim's `holm_family` is the family it was corrected in at its last look: that look,
    its members' ids, and those carried from an earlier look with the p they entered with
    (a verdict decided there may depend on them: the family's size and their p set Holm's
    step)."""
    looks = schedule(sweep["sequential"], mine)
    at = [(look(r), r) for r in mine]  # each run's look, read once
    last = min(len(looks), max((n for n, _ in at), default=1))
    arms: dict[int, list[int]] = {}  # a claim's runs' looks (`involved`), selected once
    judged: dict[str, dict] = {}
    for k in range(1, last + 1):
        alpha = looks[k - 1][1]
        rows = [r for n, r in at if n <= k]
        fresh = []
        for i, claim in enumerate(sweep["claims"]):
            before = judged.get(claim.id)
            if before and before["verdict"] != "inconclusive":
                continue
            if k > 1 and i not in arms:
                arms[i] = [look(r) for r in involved(claim, mine)]
            if k > 1 and k not in arms[i]:
                continue
            judged[claim.id] = judge(claim, rows, curves)
            fresh.append(claim.id)
        for family in (TESTED, ("self-check",)):
            members = [
                c.id
                for c in sweep["claims"]
                if c.origin in family and c.id in judged and judged[c.id]["tests"]
            ]
            ps = []
            for cid in members:
                j = judged[cid]
                if cid in fresh:
                    ps.append(max(t.p for t in j["tests"]))
                else:
                    ps.append(0.0 if j["verdict"] == "holds" else 1.0)
            carried = {c: p for c, p in zip(members, ps, strict=True) if c not in fresh}
            for cid, p in zip(members, holm(ps), strict=True):
                if cid in fresh:
                    judged[cid].update(p_holm=p, family=len(members), holm_family={
                        "look": k, "ids": members, "carried": carried})  # fmt: skip
        for cid in fresh:
            j = judged[cid]
            if j["verdict"] is None:  # a test (the count kinds come decided)
                j["verdict"] = decide(j["tests"], j.get("p_holm", 1.0), alpha)
            j.update(look=k, alpha=alpha, looks=len(looks))
            # detectable at Holm's strictest step, α / the family's size (conservative)
            j["mde"] = max((t.mde(alpha / j.get("family", 1)) for t in j["tests"]),
                           key=lambda x: math.inf if x is None else x, default=None)  # fmt: skip
    return [(c, judged[c.id]) for c in sweep["claims"]]


def _sweeps(
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    configs: Mapping[str, dict[str, Any]] | None = None,
):
    """(name, sweep, its rows) for every sweep found under the runs, blow-ups marked."""
    rows, sweeps = claim_rows(runs, configs)
    mark_blow_ups(rows, curves)
    for name, sweep in sweeps.items():
        yield name, sweep, [r for r in rows if r["sweep"] == name]


def stuck(claim: ClaimConfig, j: dict[str, Any]) -> bool:
    """An inconclusive claim more seeds cannot decide: a count whose runs disagree, or a
    test that can never hold (a censored or lost seed of a) where none can ever fail."""
    if not j["tests"]:
        return j.get("n", 0) >= claim.min_seeds
    never_hold = [t.a_censored or t.lost_blocks_hold for t in j["tests"]]
    never_fail = [t.b_censored or t.lost_blocks_fail for t in j["tests"]]
    return any(never_hold) and all(never_fail)


def wanting(runs: pd.DataFrame, curves: pd.DataFrame) -> dict[str, tuple[int, list[str]]]:
    """The second stage's next block, per sweep: the next look, and the run directories
    of every claim still inconclusive at the sweep's last look while looks remain (their
    arms get the block's seeds). A sweep with nothing open is left out."""
    if runs.empty:
        return {}
    out = {}
    for name, sweep, mine in _sweeps(runs, curves):
        looks = schedule(sweep["sequential"], mine)
        now = max((look(r) for r in mine), default=1)
        if now >= len(looks):
            continue
        dirs = {
            str(r["run_dir"])
            for claim, j in _sequential(sweep, mine, curves)
            if j["verdict"] == "inconclusive" and not stuck(claim, j)
            for r in involved(claim, mine)
        }
        if dirs:
            out[name] = (now + 1, sorted(dirs))
    return out

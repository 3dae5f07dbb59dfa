"""The statistics of a claim: its advantage per seed (a − b, a / b, a, or the gap closed,
signed so that larger is better for the claim), the one-sided t-tests of the mean advantage
against the margin (paired by seed, Welch's when the sides share no seed) with their 95 %
intervals and minimum detectable effects, and what a lost seed does to a test."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
from scipy import special, stats

from stalebench.report.claim_metrics import Value
from stalebench.report.claim_sides import Side
from stalebench.sweep import ALPHA, ClaimConfig

# the power at which a claim's minimum detectable effect is stated
POWER = 0.8
# two numbers closer than this, relative to the size of what they were computed from, are
# equal: floating-point rounding (~1e-16 relative) is far below it, and every metric's own
# resolution (an evaluation interval, one test sample, a float32 loss) far above it
RESOLUTION = 1e-9
ONE = "one measurement"


def _sign(claim: ClaimConfig) -> float:
    return 1.0 if claim.better == "higher" else -1.0


def _statistic(claim: ClaimConfig, vals: list[float]) -> float:
    """The claim's number for one seed: a − b, a / b, a, or (a − b) / (c − b)."""
    if claim.kind == "ordering":
        return vals[0] - vals[1]
    if claim.kind == "ratio":
        return vals[0] / vals[1] if vals[1] and math.isfinite(vals[1]) else math.nan
    if claim.kind == "threshold":
        return vals[0]
    span = vals[2] - vals[1]  # gap_closed
    return (vals[0] - vals[1]) / span if span and math.isfinite(span) else math.nan


def _size(claim: ClaimConfig, vals: list[float]) -> float:
    """The size of what one seed's statistic was computed from, in the statistic's units:
    its rounding error is about that times the machine's epsilon."""
    if claim.kind in ("ordering", "threshold"):
        return max(abs(v) for v in vals)
    stat = abs(_statistic(claim, vals))
    if claim.kind == "ratio" or math.isnan(stat):
        return 0.0 if math.isnan(stat) else stat
    return max(abs(v) for v in vals) / abs(vals[2] - vals[1])  # gap_closed


def _tolerance(claim: ClaimConfig, sizes: list[float]) -> float:
    """How close to the margin an advantage is a tie (RESOLUTION relative to the
    statistic's operands, the bound and the margin)."""
    finite = [x for x in sizes if math.isfinite(x)]
    return RESOLUTION * max(1.0, abs(_bound(claim)), claim.margin, *finite)


def _undefined(claim: ClaimConfig, vals: list[float]) -> str:
    if claim.kind == "ratio":
        return f"a / b undefined: b = {vals[1]:g}"
    return f"(a − b) / (c − b) undefined: c − b = {vals[2] - vals[1]:g}"


def _lost_blocks(claim: ClaimConfig, k: int) -> tuple[bool, bool]:
    """(keeps the claim from holding, keeps it from failing) for a seed lost on side k
    (0: a, 1: b, 2: c). `failures: inconclusive` (the default): both (survivorship: what
    the lost run would have shown is unknown); `worst`: the worst outcome for its side
    (a: against the claim, b of an ordering or ratio: for it; b or c of a gap, whose sign
    depends on both, and a trend's steps: both)."""
    if claim.failures == "worst" and claim.kind in ("ordering", "ratio", "threshold"):
        return (True, False) if k == 0 else (False, True)
    if claim.failures == "worst" and claim.kind == "gap_closed" and k == 0:
        return True, False
    return True, True


def _bound(claim: ClaimConfig) -> float:
    return 0.0 if claim.kind == "ordering" else claim.value


def _names(claim: ClaimConfig) -> str:
    return {"ordering": "a − b", "ratio": "a / b", "threshold": "a"}.get(
        claim.kind, "(a − b) / (c − b)"
    )


@dataclasses.dataclass
class Test:
    """One one-sided test of a claim's advantage against its margin."""

    label: str  # what was tested (the statistic, a scope or a step)
    n: int  # seeds (per side when unpaired: the smallest side)
    estimate: float  # the statistic at the seeds' mean (a − b, a / b, ...)
    mean: float  # the mean advantage (larger is better for the claim)
    ci: tuple[float, float]  # its 95 % interval
    against: float  # what the advantage is tested against (the margin; 0 when folded in)
    p: float  # one-sided p of "mean advantage <= against"
    test: str  # paired t, one-sample t, Welch t
    a_censored: bool = False  # a lower bound on a's side: may not make the claim hold
    b_censored: bool = False  # a lower bound on the other side: may not make it fail
    short: bool = False  # fewer usable seeds than the claim's min_seeds
    # seeds lost on a side (a run diverged, failed or without the metric, or the statistic
    # undefined), as "seed s (why)", and what they keep the claim from (`_lost_blocks`)
    lost: list[str] = dataclasses.field(default_factory=list)
    lost_blocks_hold: bool = False
    lost_blocks_fail: bool = False
    se: float = math.inf  # the standard error of `mean` (0: no spread; inf: untestable)
    df: float = math.nan  # its degrees of freedom
    once: bool = False  # the n seeds' numbers are bit-identical on every side: one measurement
    why: str = ""  # why Welch's test, not the paired one (empty when paired)

    @property
    def measurements(self) -> int:
        """The distinct measurements behind the test: 1 for deterministic seeds."""
        return 1 if self.once else self.n

    @property
    def can_hold(self) -> bool:
        return not (self.a_censored or self.short or self.lost_blocks_hold)

    def interval(self, alpha: float = ALPHA) -> tuple[float, float]:
        """The two-sided (1 − alpha) interval of the mean advantage (`ci` at alpha = 0.05)."""
        if self.se == 0.0:
            return self.ci
        if not (math.isfinite(self.se) and self.df > 0):
            return (-math.inf, math.inf)
        half = _t_ppf(1.0 - alpha / 2.0, self.df) * self.se
        return (self.mean - half, self.mean + half)

    def fails_at(self, alpha: float = ALPHA) -> bool:
        """Does not hold at a look of level `alpha`: its (1 − alpha) interval lies below
        the margin, or a deterministic tie at it (known, and not more than it)."""
        lo, hi = self.interval(alpha)
        below = hi < self.against or lo == hi == self.against
        return below and not (self.b_censored or self.short or self.lost_blocks_fail)

    @property
    def fails(self) -> bool:
        return self.fails_at(ALPHA)

    def mde(self, alpha: float) -> float | None:
        """The smallest true mean advantage this test detects with probability POWER at a
        one-sided level `alpha`, from its own spread: against + (t₁₋α + t_power)·se."""
        if self.se == 0.0:
            return self.against
        if not (math.isfinite(self.se) and self.df > 0):
            return None
        t = _t_ppf(1.0 - alpha, self.df) + _t_ppf(POWER, self.df)
        return self.against + t * self.se

    def shown(self, names: str, unit: str = "") -> str:
        """The verdict line: the statistic of the named sides, the advantage with its 95 %
        interval against the margin, in the metric's unit (`unit`, e.g. " s")."""
        lo, hi = self.ci
        n = f"{ONE}: {self.n} identical seeds" if self.once else f"n = {self.n}"
        return (
            f"{names} = {self.estimate:.4g}{unit}; advantage {self.mean:.3g}{unit} "
            f"[95% CI {lo:.3g}, {hi:.3g}] vs margin {self.against:.3g}{unit}, "
            f"p = {self.p:.2g} ({self.test}, {n})"
        )


@functools.lru_cache(maxsize=4096)
def _t_ppf(q: float, df: float) -> float:
    """scipy.stats.t.ppf(q, df) as a float, remembered: a report asks for the same few
    quantiles (0.975, 1 − α / 2, 1 − α, POWER at n − 1 degrees of freedom) over and over,
    and each call costs ~0.1 ms of scipy's argument checking (the Monte-Carlo checks of the
    rule make hundreds of thousands)."""
    return float(stats.t.ppf(q, df))


def _ttest_greater(d: np.ndarray, against: float) -> float:
    """scipy.stats.ttest_1samp(d, against, alternative="greater").pvalue for a 1-D float
    array, computed as scipy (1.17) computes it: the same numpy reductions in the same order
    (the mean; the variance as the mean of the squared deviations, times n / (n − 1)), then
    scipy.special.stdtr, the function scipy's own t distribution calls for it; NaN, as
    scipy's, for fewer than two values or a NaN or infinite one. The same number to the bit
    (tests/unit/test_seq_fast_paths.py compares the two on many inputs, edge cases
    included). numpy here, not the scipy call, because ttest_1samp spends ~1 ms a call in
    its array-API and nan-policy wrappers (this, ~30 µs): most of the time of the rule's
    Monte-Carlo checks, which make one call per claim and look. (scipy's warning of values
    equal up to 1e-15 cannot arise here: `_one_sided` decides those before any test.)"""
    n = len(d)
    if n < 2:
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mean = d.mean()
        var = ((d - mean) ** 2).mean()
        var *= np.float64(n) / np.float64(n - 1)
        t = (mean - np.float64(against)) / np.sqrt(var / n)
        return float(special.stdtr(np.float64(n - 1), -t))


def one_sided(
    d: np.ndarray, against: float, tol: float = 0.0
) -> tuple[float, tuple[float, float], float]:
    """Mean of d, its 95 % t interval and the one-sided p of H0: mean(d) <= against
    (scipy.stats.ttest_1samp). Identical values (a deterministic statistic, equal within
    `tol`) give an interval of zero width and p 0 or 1; a mean within `tol` of `against`
    is a tie, not a lead: the mean and interval are `against` itself, p 1."""
    m, ci, p, _, _ = _one_sided(d, against, tol)
    return m, ci, p


def _one_sided(
    d: np.ndarray, against: float, tol: float = 0.0
) -> tuple[float, tuple[float, float], float, float, float]:
    """one_sided, and the mean's standard error and degrees of freedom."""
    d = np.asarray(d, dtype=float)
    m = float(d.mean())
    sd = float(d.std(ddof=1)) if len(d) > 1 else math.nan
    if len(d) < 2 or math.isnan(sd):
        return m, (-math.inf, math.inf), 1.0, math.inf, math.nan
    tol = max(tol, 1e-12 * max(1.0, abs(m)))
    df = float(len(d) - 1)
    if sd <= tol:  # equal up to rounding: no spread to test against
        if abs(m - against) <= tol:  # e.g. 3.6 − 3.4 against 0.2: one interval, no more
            return against, (against, against), 1.0, 0.0, df
        return m, (m, m), 0.0 if m > against else 1.0, 0.0, df
    se = sd / math.sqrt(len(d))
    half = _t_ppf(0.975, df) * se
    p = _ttest_greater(d, against)
    return m, (m - half, m + half), p, se, df


def welch(
    samples: list[np.ndarray], weights: list[float], offset: float = 0.0, tol: float = 0.0
) -> tuple[float, tuple[float, float], float, float, float]:
    """Welch's test of a contrast Σ wᵢ·mean(xᵢ) + offset > 0 over independent samples: its
    value, 95 % interval, one-sided p, standard error and Welch–Satterthwaite degrees of
    freedom (no spread: a value within `tol` of 0 is a tie, as in `one_sided`)."""
    means = [float(np.mean(x)) for x in samples]
    parts = [
        w * w * float(np.var(x, ddof=1)) / len(x) for w, x in zip(weights, samples, strict=True)
    ]
    value = sum(w * m for w, m in zip(weights, means, strict=True)) + offset
    var = sum(parts)
    if any(len(x) < 2 for x in samples):
        return value, (-math.inf, math.inf), 1.0, math.inf, math.nan
    if var <= 1e-24 * max(1.0, value * value):
        df = float(sum(len(x) for x in samples) - len(samples))
        if abs(value) <= tol:
            return 0.0, (0.0, 0.0), 1.0, 0.0, df
        return value, (value, value), 0.0 if value > 0 else 1.0, 0.0, df
    df = var * var / sum(p * p / (len(x) - 1) for p, x in zip(parts, samples, strict=True))
    se = math.sqrt(var)
    half = _t_ppf(0.975, df) * se
    return value, (value - half, value + half), float(stats.t.sf(value / se, df)), se, df


def _identical(values: list[Value]) -> bool:
    """Two or more numbers, bit-identical (and censored alike): deterministic runs, whose
    seeds change nothing, measured once however many seeds ran."""
    return len(values) > 1 and len({(v.x, v.censored) for v in values}) == 1


def _lose(claim: ClaimConfig, test: Test, lost: list[tuple[Any, int, str]]) -> Test:
    """The test with its lost seeds (seed, side index, why) and what they block."""
    for seed, k, why in lost:
        test.lost.append(f"seed {seed} ({'abc'[k] + ': ' if k >= 0 else ''}{why})")
        hold, fail = _lost_blocks(claim, k) if k >= 0 else (True, True)
        test.lost_blocks_hold |= hold
        test.lost_blocks_fail |= fail
    return test


def compare(claim: ClaimConfig, sides: list[Side], label: str = "") -> Test:
    """The claim's test on its sides: paired by seed when the sides share seeds, Welch's
    test of the sides' means when they share none (a threshold has one side: a one-sample
    test). A seed every side ran but one side lost (its run diverged, failed or has no
    value of the metric), or whose statistic is undefined (a zero or non-finite
    denominator), is never silently left out: it is named, and keeps the claim from
    holding or failing as `claim.failures` says (`_lost_blocks`; undefined: both)."""
    sign, bound, a, rest = _sign(claim), _bound(claim), sides[0], sides[1:]
    names = _names(claim)
    seeds = sorted(a.values, key=str)
    paired = [s for s in seeds if all(s in r.values for r in rest)]
    ran = sorted(set.intersection(*(x.seeds for x in sides)), key=str)
    lost = [(s, k, x.unusable[s]) for s in ran for k, x in enumerate(sides) if s in x.unusable]
    if claim.kind == "threshold" or paired:
        vals = [[x.values[s].x for x in sides] for s in paired]
        stat = np.array([_statistic(claim, v) for v in vals])
        keep = ~np.isnan(stat)
        used = [s for s, k in zip(paired, keep, strict=True) if k]
        lost += [(s, -1, _undefined(claim, v)) for s, v, k in zip(paired, vals, keep, strict=True)
                 if not k]  # fmt: skip
        stat = stat[keep]
        n = len(stat)
        if not n:
            return _lose(claim, Test(label or names, 0, math.nan, math.nan, (math.nan,) * 2, 0,
                                     1.0, "none", short=True), lost)  # fmt: skip
        tol = _tolerance(claim, [_size(claim, v) for v, k in zip(vals, keep, strict=True) if k])
        mean, ci, p, se, df = _one_sided(sign * (stat - bound), claim.margin, tol)
        once = all(_identical([x.values[s] for s in used]) for x in sides)
        return _lose(claim, Test(
            label or names, n, float(stat.mean()), mean, ci, claim.margin, p,
            "one-sample t" if claim.kind == "threshold" else "paired t",
            any(a.values[s].censored for s in used),
            any(r.values[s].censored for r in rest for s in used),
            n < claim.min_seeds, se=se, df=df, once=once,
        ), lost)  # fmt: skip
    # no seed in common: Welch's test of the contrast whose sign is the claim, the margin
    # folded into it (so the interval is tested against 0)
    xs = [side.xs for side in sides]
    means = [float(x.mean()) for x in xs]
    edge = bound + sign * claim.margin
    if claim.kind == "ordering":
        weights, offset = [sign, -sign], -claim.margin
    elif claim.kind == "ratio":  # sign·(a/b − bound) > margin  ⇔  sign·a − edge'·b > 0
        weights, offset = [sign, -sign * edge], 0.0
    else:  # gap_closed: a − b − edge·(c − b) > 0, flipped when c lies below b
        flip = sign * (1.0 if means[2] >= means[1] else -1.0)
        weights, offset = [flip, flip * (edge - 1.0), -flip * edge], 0.0
    # unpaired, every run of a side is in the test: each lost run is lost to it
    lost = [(s, k, why) for k, x in enumerate(sides) for s, why in x.unusable.items()]
    mean, ci, p, se, df = welch(xs, weights, offset, _tolerance(claim, [_size(claim, means)]))
    n = min(len(x) for x in xs)
    once = all(_identical(list(x.values.values())) for x in sides)
    why = "the sides share no seed (" + "; ".join(
        f"{k}: seeds {', '.join(str(s) for s in sorted(x.values, key=str))}"
        for k, x in zip("abc", sides, strict=False)) + ")"  # fmt: skip
    return _lose(claim, Test(
        (label or names) + " (unpaired: a contrast of the means)", n, _statistic(claim, means),
        mean, ci, 0.0, p, "Welch t", any(v.censored for v in a.values.values()),
        any(v.censored for r in rest for v in r.values.values()), n < claim.min_seeds,
        se=se, df=df, once=once, why=why,
    ), lost)  # fmt: skip


def _lost_notes(claim: ClaimConfig, tests: list[Test]) -> list[str]:
    """One note per test that lost seeds: which, and what that does to the verdict."""
    notes = []
    for t in tests:
        if not t.lost:
            continue
        blocks = " or ".join(
            w for w, b in (("hold", t.lost_blocks_hold), ("fail", t.lost_blocks_fail)) if b
        )
        how = "counted as the worst for their side" if claim.failures == "worst" else (
            "survivorship: what they would have shown is unknown")  # fmt: skip
        notes.append(f"{t.label or 'claim'}: lost {', '.join(t.lost)}; {how}, so the claim "
                     f"cannot {blocks}")  # fmt: skip
    return notes

"""Judge a paper sweep's claims from its run directories.

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

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import special, stats

from stalebench.metrics.summary import EVAL_KEYS, final_tail
from stalebench.sweep import (
    ALPHA,
    TARGET_KEYS,
    ClaimConfig,
    SequentialConfig,
    TargetConfig,
    claim_from_dict,
    sequential_from,
)

# the power at which a claim's minimum detectable effect is stated
POWER = 0.8
CORRECTION = "holm"
VERDICTS = ("holds", "does not hold", "inconclusive", "not run")
USABLE = ("completed", "diverged")  # a failed or timed-out run measures nothing
# budget.diverge_factor's default (stalebench.config.BudgetConfig; a report imports no run
# config): a run's own value is read from its config
DIVERGE_FACTOR = 10.0
# two numbers closer than this, relative to the size of what they were computed from, are
# equal: floating-point rounding (~1e-16 relative) is far below it, and every metric's own
# resolution (an evaluation interval, one test sample, a float32 loss) far above it
RESOLUTION = 1e-9
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
# the short caveats a verdict record lists (`caveats`), each also noted per seed in `notes`
BLOW_UP = "blow-up after the target"
AT_ZERO = "target met at t = 0"
ONE = "one measurement"
# whose a claim's value and margin are (`threshold_from`), as a table says it
WHOSE = {"ours": "ours", "paper": "the paper's"}
# a claim's final_accuracy / final_loss / final_perplexity: the quantity's final_tail
TAIL_METRICS = {f"final_{k}": k for k in EVAL_KEYS}


class ClaimError(ValueError):
    """A claim that cannot be judged from these runs as written (a selector that matches
    two runs of one seed)."""


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


def dotted(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys -> leaves (an empty mapping below the top is a leaf of
    its own, so that `{}` and a filled mapping differ)."""
    if not isinstance(obj, dict) or (not obj and prefix):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        out.update(dotted(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def claim_rows(
    runs: pd.DataFrame, configs: Mapping[str, dict[str, Any]] | None = None
) -> tuple[list[dict], dict[str, dict]]:
    """One dict per run (summary fields + dotted config keys, e.g. `algorithm.barrier.staleness`)
    and the sweeps found in the runs' configs: name -> {paper, scale, claims}. `configs`:
    each run directory's config already read (load_config's), else each is read here."""
    rows, sweeps = [], {}
    for run in runs.to_dict("records"):
        if configs is None:
            config = load_config(run["run_dir"])
        else:
            config = configs[run["run_dir"]]
        name = add_sweep(config, sweeps)
        keys = {k: v for k, v in dotted(config).items() if "." in k and k != "sweep.claims"}
        rows.append({**keys, **run, "sweep": name})
    return rows, sweeps


def add_sweep(config: dict[str, Any], sweeps: dict[str, dict]) -> str:
    """The name of the sweep a run's config belongs to ("" for none), its paper, scale,
    claims and second stage added to `sweeps` the first time it is seen."""
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
            "sequential": sequential_from(sweep.get("sequential")),
        }
    return name


def _same(have: Any, want: Any) -> bool:
    if isinstance(want, list | tuple):
        return any(_same(have, w) for w in want)
    try:
        return float(have) == float(want)
    except (TypeError, ValueError):
        return str(have) == str(want)


def _matcher(want: Any):
    """`have -> _same(have, want)`, with `want` looked at once rather than per row: a str
    that is no number (an algorithm's name) equals a str `have` exactly when the two are
    the same string, and a float or int one equals a float `have` exactly when their
    floats are equal, which is what _same finds for them after its float() attempts."""
    if type(want) is str:
        try:
            float(want)
        except ValueError:
            return lambda have: have == want if type(have) is str else _same(have, want)
    elif type(want) in (int, float):
        try:
            number = float(want)
        except OverflowError:  # an int past a float: _same's own path raises or compares
            return lambda have: _same(have, want)
        return lambda have: float(have) == number if type(have) is float else _same(have, want)
    return lambda have: _same(have, want)


def select(rows: list[dict], selector: dict[str, Any]) -> list[dict]:
    """The rows whose value of every key of the selector is the same as its (`_same`)."""
    picked = list(rows)
    for key, same in [(k, _matcher(v)) for k, v in selector.items()]:
        picked = [r for r in picked if same(r.get(key))]
    return picked


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


@dataclasses.dataclass
class Side:
    """The selected runs of one side of a claim, by seed."""

    values: dict[Any, Value]
    runs: int  # selected runs, any status
    unusable: dict[Any, str] = dataclasses.field(default_factory=dict)  # seed -> why

    @property
    def seeds(self) -> set:
        """The seeds this side has a run of, usable or not."""
        return set(self.values) | set(self.unusable)

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


def one_per_seed(rows: list[dict], claim: ClaimConfig, name: str) -> dict[Any, dict]:
    """The selected runs by seed. Two runs of one seed are an error naming them: which one
    the claim meant cannot be guessed."""
    by_seed: dict[Any, list[dict]] = {}
    for row in rows:
        by_seed.setdefault(row.get("seed"), []).append(row)
    for seed, found in by_seed.items():
        if len(found) > 1:
            raise ClaimError(
                f"claim {claim.id!r}: selector {name} matches {len(found)} runs of seed "
                f"{seed}: {', '.join(str(r.get('run_dir')) for r in found)}; add the key that "
                f"tells them apart to the claim's `{name}` or `where`"
            )
    return {seed: found[0] for seed, found in by_seed.items()}


def side(rows: list[dict], claim: ClaimConfig, curves: pd.DataFrame, name: str = "a") -> Side:
    """A side's value per seed, and why each unusable seed is."""
    values, unusable = {}, {}
    for seed, row in one_per_seed(rows, claim, name).items():
        v = metric(row, claim, curves)
        if v is None:
            status = row.get("status")
            why = status if status not in USABLE else f"{status}, no {claim.metric}"
            if row.get("diverged_why"):
                why += f": {row['diverged_why']}"
            unusable[seed] = why
        else:
            values[seed] = v
    return Side(values, len(rows), unusable)


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


def _flag_notes(name: str, side: Side, caveats: list[str]) -> list[str]:
    """One note per caveat of a side's seeds (a target met at t = 0, a blow-up after it),
    the caveats added to `caveats`."""
    notes = []
    for seed, v in side.values.items():
        for short, what in v.flags.items():
            notes.append(f"{name}: seed {seed} {what}")
            caveats.append(short)
    return notes


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

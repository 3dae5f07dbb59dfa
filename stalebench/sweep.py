"""A paper's sweep and its claims, as data (the `sweep` node of a run's config).

A sweep file under `sweeps/` sets `sweep.name`, the paper, the scale and the claims; every
run of the sweep carries them in its `.hydra/config.yaml`, so `stalebench-report` can judge
the claims from the run directories alone. This module is pure (no torch, no engines):
the schema is shared by the CLI, which validates it before any process starts, and by the
report, which evaluates it.

How a claim is judged (stalebench.report.claim_judge; docs/design.md, "Claims"):

- every claim states `origin` (paper: the paper's checked text; recalled: a statement
  recalled from the paper, not checked against its text; self-check: a check of the harness
  itself, reported apart from the paper's tally), `threshold_from` (paper | ours: whose
  numbers `value` and `margin` are; a number transcribed by a third party and never checked
  may stand in `published`, never in `value` or `margin`) and `margin` (the smallest
  advantage that counts, in the statistic's units: ordering and trend in the metric's, ratio
  in a/b, threshold in the metric's, gap_closed as a fraction of the gap; "slightly",
  "much", "within x %" become numbers here, marked as ours in `text`).
- per seed an advantage d = ±(statistic − bound); a one-sided t-test of mean d > margin
  (paired by seed, Welch when the sides do not pair), α = 0.05 with Holm's correction over
  the paper and recalled claims of one sweep (self-checks are a family of their own).
  holds: significant beyond the margin; does not hold: the 95 % interval of the mean
  advantage lies below the margin; inconclusive otherwise, or with fewer than `min_seeds`
  usable seeds.
- `per` gives one joint verdict (it holds only if it holds at every value); `trend` is
  tested at every consecutive step of `over`; a diverged run never reaches a target and is
  unusable for every other metric; failed runs never count as diverged; a selector that
  matches two runs of one seed is an error.
- kind `fails`: every usable run of `a` ends at a final test accuracy within `value` of
  chance (summary.json `chance_accuracy`): training fails, as distinct from `diverges`
  (numeric divergence).
- kind `reproduces`: a number the paper published (`value`, in the metric's units: a
  training time, a throughput) against ours, as a ratio: it holds when every usable run of
  `a` (at least `min_seeds`) lands within `tolerance` of it (ours / theirs in
  [1 / tolerance, tolerance]), does not hold when none does; a count, not a test (a
  cost-only run at the paper's scale is deterministic: its seeds agree). With `b`, ours is
  a's gain over b on the same seed, the published "x % faster": a / b − 1 where the metric
  is better higher (a throughput), b / a − 1 where lower (a time); with `relative:
  factor`, the factor a / b (or b / a), the published speed-up "53X". With `over`, ours is a
  seed's best over the values of that key among its runs, the published "as much as": a
  seed lacking a usable run at any of them is lost. `tolerance` is at most ×2 (MAX_TOLERANCE):
  ours within half to twice theirs; a looser one says nothing a published number could be
  held to.
- `stable` (metric=time_to_target only): the claim is about stable training (it "converges"
  sooner), so a run that blows up after reaching the target (its held-out loss later above
  its first) has not reached it: censored at its end. Without it the blow-up is noted only.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from stalebench.errors import ConfigError

KINDS = (
    "ordering", "ratio", "threshold", "diverges", "fails", "gap_closed", "trend", "reproduces",
)  # fmt: skip
# where a claim comes from: the paper's text (checked), a statement recalled from the paper
# (not checked against its text), or a check of the harness itself (reported apart from the
# paper's tally)
ORIGINS = ("paper", "recalled", "self-check")
# whose number a claim's `value` and `margin` are
THRESHOLD_FROM = ("paper", "ours")
DIRECTIONS = ("lower", "higher")
# how a run lost on one side of a claim counts (diverged for any metric but a time to
# target, failed, timed out, or without a value of the metric): `inconclusive` (the claim
# can neither hold nor fail: survivorship), or `worst` (the worst outcome for its side: a
# lost run of `a` keeps the claim from holding, one of `b` keeps it from failing)
FAILURES = ("inconclusive", "worst")
SCALES = ("small", "full")
# reproduces with b: a's number relative to b's, as a gain (a / b − 1) or a factor (a / b)
RELATIVES = ("gain", "factor")
# reproduces: the loosest tolerance, a factor of two either way (ours / theirs in [1/2, 2])
MAX_TOLERANCE = 2.0
# metrics whose "better" direction is implied, so a claim cannot get it backwards
TARGET_KEYS = {"loss": "lower", "perplexity": "lower", "accuracy": "higher"}


@dataclasses.dataclass
class TargetConfig:
    """metric=time_to_target: the first eval time at which `split`'s `key` reaches `value`
    (at or below it for loss and perplexity, at or above it for accuracy)."""

    split: str = "test"
    key: str = "accuracy"  # accuracy | loss | perplexity
    value: float = 0.0


@dataclasses.dataclass
class ClaimConfig:
    id: str = ""  # short key, unique in the sweep
    text: str = ""  # the claim in our words, keeping the paper's direction
    # a number per run: a summary.json key, flattened with "_" (final_accuracy, lag_mean,
    # compute_fraction, clocks_mean, throughput_updates_per_s, ...), or time_to_target
    metric: str = ""
    target: Optional[TargetConfig] = None  # noqa: UP045  metric=time_to_target only
    # lower | higher: which way `metric` improves for the claim; required (no default)
    better: Optional[str] = None  # noqa: UP045
    # ordering: a beats b; ratio: mean(a)/mean(b) on the better side of value; threshold:
    # a on the better side of value; diverges: every run of a diverges; gap_closed: a goes
    # at least (better=higher) or at most (lower) `value` of the way from b to c; trend: the
    # metric (of a, or of a − b) at the largest `over` beats it at the smallest
    kind: str = "ordering"
    a: dict[str, Any] = dataclasses.field(default_factory=dict)  # run selector: key -> value
    b: dict[str, Any] = dataclasses.field(default_factory=dict)
    c: dict[str, Any] = dataclasses.field(default_factory=dict)
    where: dict[str, Any] = dataclasses.field(default_factory=dict)  # added to a, b and c
    per: str = ""  # a key: one verdict per value of it among the selected runs
    # trend: the key the trend runs along (e.g. num_workers); reproduces: the key whose
    # values ours is the best over (a published "as much as")
    over: str = ""
    value: float = 0.0  # the bound of ratio, threshold and gap_closed; reproduces: theirs
    # reproduces: how far ours may be from the published `value`, as a ratio in (1,
    # MAX_TOLERANCE]: ours / theirs within [1 / tolerance, tolerance]
    tolerance: float = 0.0
    # reproduces with b: ours is a's gain over b (`gain`: a / b − 1, or b / a − 1 for a
    # lower-is-better metric, a published "+25 %") or the factor (`factor`: a / b, or b / a;
    # a published speed-up, "53X")
    relative: str = "gain"
    published: str = ""  # the paper's number or wording, beside ours
    source: str = ""  # where the published value comes from
    origin: str = ""  # paper | recalled | self-check (ORIGINS)
    threshold_from: str = "ours"  # paper | ours: whose number `value` and `margin` are
    # the smallest advantage that counts, in the statistic's units (ordering and trend: the
    # metric's; ratio: a/b; threshold: the metric's; gap_closed: a fraction of the gap;
    # fails: ε above chance accuracy is `value`, margin unused): "holds" needs the one-sided
    # test of advantage > margin to reject at α (Holm-corrected over the paper's claims)
    margin: Optional[float] = None  # noqa: UP045  required: 0 says "any advantage counts"
    min_seeds: int = 3  # usable paired seeds (runs on every side) a verdict needs
    failures: str = "inconclusive"  # how a run lost on one side counts (FAILURES)
    # metric=time_to_target: the claim is about stable training; a run whose held-out loss
    # passes its first after it reached the target has not reached it (noted either way)
    stable: bool = False

    def check(self, where: str) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"{where}.{key} must be {valid}, got {value!r}")

        if not self.id:
            raise bad("id", self.id, "a non-empty name")
        for key, valid in (
            ("margin", "set: the smallest advantage that counts (0: any)"),
            ("better", "set: lower or higher, the direction the claim calls better"),
        ):
            if getattr(self, key) is None:
                raise ConfigError(f"{where}.{key} (claim {self.id!r}) must be {valid}")
        if self.kind not in KINDS:
            raise bad("kind", self.kind, f"one of {', '.join(KINDS)}")
        if self.better not in DIRECTIONS:
            raise bad("better", self.better, f"one of {', '.join(DIRECTIONS)}")
        if self.origin not in ORIGINS:
            raise bad("origin", self.origin, f"one of {', '.join(ORIGINS)}")
        if self.threshold_from not in THRESHOLD_FROM:
            raise bad("threshold_from", self.threshold_from, f"one of {', '.join(THRESHOLD_FROM)}")
        if self.failures not in FAILURES:
            raise bad("failures", self.failures, f"one of {', '.join(FAILURES)}")
        if self.margin < 0:
            raise bad("margin", self.margin, ">= 0")
        if self.min_seeds < 2:
            raise bad("min_seeds", self.min_seeds, ">= 2 (a test needs two seeds)")
        if self.kind not in ("diverges", "fails") and not self.metric:
            raise bad("metric", self.metric, f"a run metric for kind={self.kind}")
        if not self.a:
            raise bad("a", self.a, "a run selector (e.g. {algorithm: dssp})")
        if self.kind in ("ordering", "ratio", "gap_closed") and not self.b:
            raise bad("b", self.b, f"a run selector for kind={self.kind}")
        if self.kind == "gap_closed" and not self.c:
            raise bad("c", self.c, "a run selector for kind=gap_closed")
        if self.kind == "trend" and not self.over:
            raise bad("over", self.over, "a key (e.g. num_workers) for kind=trend")
        if self.kind == "reproduces":
            if self.per or self.c:
                raise bad("per" if self.per else "c", self.per or self.c,
                          "unset for kind=reproduces (one claim per published number)")  # fmt: skip
            if not self.value > 0:
                raise bad("value", self.value, "the published number (> 0) for kind=reproduces")
            if not 1 < self.tolerance <= MAX_TOLERANCE:
                within = f"a ratio > 1 and <= {MAX_TOLERANCE:g} for kind=reproduces"
                raise bad("tolerance", self.tolerance, within)
            if self.relative not in RELATIVES:
                raise bad("relative", self.relative, f"one of {', '.join(RELATIVES)}")
            if self.relative != "gain" and not self.b:
                raise bad("relative", self.relative, "gain (the default) for a claim without b")
        if not isinstance(self.stable, bool):
            raise bad("stable", self.stable, "true or false")
        if self.stable and self.metric != "time_to_target":
            raise bad("stable", self.stable, "false (the default) unless metric=time_to_target")
        if self.metric == "time_to_target":
            if self.target is None:
                raise bad("target", None, "{split, key, value} for metric=time_to_target")
            if self.target.key not in TARGET_KEYS:
                raise bad("target.key", self.target.key, f"one of {', '.join(TARGET_KEYS)}")
            if self.better != "lower":
                raise bad("better", self.better, "lower for metric=time_to_target")


@dataclasses.dataclass
class SelectTargetConfig(TargetConfig):
    """select.metric=time_to_target: a claim's target read on the validation split. `split`
    can only be val: a tuning run never evaluates the test split."""

    split: str = "val"


# summary keys (flattened with "_") whose better direction is implied
SUMMARY_DIRECTIONS = {f"final_{k}": d for k, d in TARGET_KEYS.items()}
SUMMARY_DIRECTIONS["best_accuracy"] = "higher"


@dataclasses.dataclass
class SelectConfig:
    """What a tuning run is scored by, on the validation split: `metric` is time_to_target
    (with `target`: the validation split's `key` reaching `value`) or a summary key
    (final_loss, final_accuracy, ...), `better` its direction. A grid point's score is the
    mean over the tuning seeds. Ties, and grid points that never reach the target (or have
    no value of the metric), are ranked by the final validation loss; a grid point any of
    whose runs diverged or failed ranks after every one that did not."""

    metric: str = "final_loss"
    target: Optional[SelectTargetConfig] = None  # noqa: UP045  metric=time_to_target only
    better: str = "lower"

    def __post_init__(self) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"sweep.tune.select.{key} must be {valid}, got {value!r}")

        if not self.metric:
            raise bad("metric", self.metric, "time_to_target or a summary key (final_loss)")
        if self.better not in DIRECTIONS:
            raise bad("better", self.better, f"one of {', '.join(DIRECTIONS)}")
        implied = SUMMARY_DIRECTIONS.get(self.metric)
        if implied and self.better != implied:
            raise bad("better", self.better, f"{implied} for metric={self.metric}")
        if self.metric == "time_to_target":
            target = self.target
            if target is None:
                raise bad("target", None, "{key, value} for metric=time_to_target")
            if isinstance(target, SelectTargetConfig):  # OmegaConf may build it afterwards
                if target.split != "val":
                    raise bad("target.split", target.split, "val (tuning selects on val)")
                if target.key not in TARGET_KEYS:
                    raise bad("target.key", target.key, f"one of {', '.join(TARGET_KEYS)}")
            if self.better != "lower":
                raise bad("better", self.better, "lower for metric=time_to_target")


@dataclasses.dataclass
class TuneConfig:
    """The tuning protocol of a sweep: every cell of the sweep's grid (every combination of
    its parameters but the seed: an arm, a cluster, a number of workers) is tuned over the
    same grid, on a validation split carved from the training data, with tuning seeds of
    its own; the final runs (the sweep's seeds) use each cell's selection. Empty `params`:
    no tuning (the grid runs as written). The sweeper (hydra_plugins/stalebench_sweeper)
    runs it; docs/design.md, "Tuning protocol"."""

    # dotted config key -> candidate values: the grid every cell gets (the same budget);
    # typed loosely so that a value that is not a list is refused by name, below
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    # an arm's own grid (arm: its option under sweeps/arms/<paper>/), replacing `params` for
    # it: an outer learning rate where only that arm has one; same number of points
    arms: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    seeds: list[int] = dataclasses.field(default_factory=lambda: [1000, 1001])
    validation_fraction: float = 0.1  # of the training split, held out for selection
    # a cell whose best point is at an edge of a geometric axis of its grid gets up to this
    # many points beyond that edge, one at a time, at the grid's own ratio (0: none)
    max_extensions: int = 4
    select: SelectConfig = dataclasses.field(default_factory=SelectConfig)
    # set by the sweeper on a final run: the values its cell selected (dotted key -> value)
    selected: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"sweep.tune.{key} must be {valid}, got {value!r}")

        points = grid_points(self.params, "sweep.tune.params")
        if self.arms and not self.params:
            raise bad("params", {}, "the grid of every arm without its own (arms is set)")
        for arm, grid in self.arms.items():
            n = grid_points(grid, f"sweep.tune.arms.{arm}")
            if n != points:
                raise bad(
                    f"arms.{arm}",
                    dict(grid),
                    f"a grid of {points} points, as sweep.tune.params (one budget), not {n}",
                )
        seeds = list(self.seeds)
        if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
            raise bad("seeds", seeds, "distinct seeds >= 0, at least one")
        if isinstance(self.max_extensions, bool) or not 0 <= self.max_extensions <= 64:
            raise bad("max_extensions", self.max_extensions, "an integer in [0, 64]")
        if not 0.0 < self.validation_fraction <= 0.5:
            raise bad("validation_fraction", self.validation_fraction, "in (0, 0.5]")

    @property
    def on(self) -> bool:
        """Whether the sweep is tuned at all."""
        return bool(self.params)


# keys a tuning grid may not set: the tuning stage sets them itself
_RESERVED = ("seed", "eval.split", "eval.validation_fraction", "sweep.tune")


def grid_points(grid: Any, where: str) -> int:
    """The number of points of a tuning grid (the product of its candidate counts); every
    key a config key, every list of candidates non-empty."""
    n = 1
    for key, values in dict(grid).items():
        name = str(key).lstrip("+~")
        if not name or any(name == r or name.startswith(r + ".") for r in _RESERVED):
            raise ConfigError(
                f"{where} may not set {key!r}: the tuning stage sets the seed and the split"
            )
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or not values:
            raise ConfigError(
                f"{where}.{key} must be a non-empty list of candidate values, got {values!r}"
            )
        n *= len(values)
    return n


# the family-wise error rate of a sweep's paper claims (and, apart, of its self-checks)
ALPHA = 0.05


@dataclasses.dataclass
class SequentialConfig:
    """The pre-declared second stage: a claim still inconclusive at the sweep's own seeds
    (look 1) gets `block` more seeds for its arms, and is judged again (look 2), and so on
    up to `max_seeds` seeds; a claim decided at a look stops there. The family's α (0.05)
    is split over the looks before any run: `alpha_first` at look 1, the rest in equal
    parts over the later looks; at each look Holm's correction runs over the whole family
    (a claim that held earlier enters with p = 0, one that did not hold or was not judged
    again with p = 1), so the chance of any false "holds" over all looks is at most the
    sum of the looks' α, 0.05 (a union bound; tests/unit/test_sequential.py simulates it).
    max_seeds at or below the sweep's seeds: one look at α = 0.05, no second stage."""

    block: int = 5  # seeds added per look
    max_seeds: int = 20  # a claim's seeds at its last look
    alpha_first: float = 0.025  # look 1's share of α; looks 2.. share ALPHA − alpha_first

    def __post_init__(self) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"sweep.sequential.{key} must be {valid}, got {value!r}")

        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise bad("block", self.block, "an integer >= 1")
        if (
            isinstance(self.max_seeds, bool)
            or not isinstance(self.max_seeds, int)
            or not (0 <= self.max_seeds <= 1000)
        ):
            raise bad("max_seeds", self.max_seeds, "an integer in [0, 1000] (0: no second stage)")
        if not 0.0 < self.alpha_first < ALPHA:
            raise bad("alpha_first", self.alpha_first, f"in (0, {ALPHA}): later looks need α too")

    def looks(self, first: int) -> list[tuple[int, float]]:
        """(seeds, α) of every look, from `first` seeds at look 1: one look at ALPHA when
        max_seeds leaves no room for a block."""
        seeds = [first]
        while seeds[-1] < self.max_seeds:
            seeds.append(min(seeds[-1] + self.block, self.max_seeds))
        if len(seeds) == 1:
            return [(first, ALPHA)]
        later = (ALPHA - self.alpha_first) / (len(seeds) - 1)
        return [(n, self.alpha_first if k == 0 else later) for k, n in enumerate(seeds)]


def sequential_from(raw: Any) -> SequentialConfig:
    """A run config's `sweep.sequential` (a mapping), or no second stage where it has none
    (a run written before there was one: judged as it was then, at α = 0.05)."""
    if not raw:
        return SequentialConfig(max_seeds=0)
    return SequentialConfig(**dict(raw))


@dataclasses.dataclass
class SweepConfig:
    name: str = ""  # the sweep's name (its file under sweeps/); empty = not a paper sweep
    paper: str = ""  # authors, title, venue
    scale: str = "small"  # small: CPU, minutes; full: the paper's scale, a GPU cluster
    # values the sweep's arms share by interpolation (e.g. a sample size set per setup:
    # `sample_size: ${sweep.params.beta}`)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    claims: list[ClaimConfig] = dataclasses.field(default_factory=list)
    tune: TuneConfig = dataclasses.field(default_factory=TuneConfig)
    sequential: SequentialConfig = dataclasses.field(default_factory=SequentialConfig)
    # set by the sweeper on the runs of a later look's seeds: which look they belong to
    look: int = 1

    @property
    def file(self) -> str:
        """The sweep file its claims come from: sweeps/<name>.yaml (a full variant names
        itself `<small>_full`, as its file is named, so that its results, W&B group and
        tallies are its own)."""
        return f"sweeps/{self.name or '<unnamed>'}.yaml"

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"sweep.scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        seen: set[str] = set()
        for i, claim in enumerate(self.claims):
            if isinstance(claim, ClaimConfig):  # OmegaConf builds the list after __post_init__
                claim.check(f"{self.file}: sweep.claims[{i}]")
                if claim.id in seen:
                    raise ConfigError(f"sweep.claims[{i}].id {claim.id!r} is used twice")
                seen.add(claim.id)


def claim_from_dict(raw: dict[str, Any], where: str = "claim") -> ClaimConfig:
    """A ClaimConfig from a plain mapping (as read back from a run's config.yaml)."""
    fields = {f.name for f in dataclasses.fields(ClaimConfig)}
    unknown = set(raw) - fields
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(fields)}")
    values = dict(raw)
    if values.get("target") is not None:
        values["target"] = TargetConfig(**values["target"])
    for key in ("a", "b", "c", "where"):
        values[key] = dict(values.get(key) or {})
    claim = ClaimConfig(**values)
    claim.check(where)
    return claim

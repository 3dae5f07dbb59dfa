"""A paper's sweep and its claims, as data (the `sweep` node of a run's config).

A sweep file under `sweeps/` sets `sweep.name`, the paper, the scale and the claims; every
run of the sweep carries them in its `.hydra/config.yaml`, so `stalebench-report` can judge
the claims from the run directories alone. This module is pure (no torch, no engines):
the schema is shared by the CLI, which validates it before any process starts, and by the
report, which evaluates it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from stalebench.errors import ConfigError

KINDS = ("ordering", "ratio", "threshold", "diverges", "gap_closed", "trend")
DIRECTIONS = ("lower", "higher")
SCALES = ("small", "full")
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
    better: str = "lower"  # lower | higher: which way `metric` improves
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
    over: str = ""  # trend: the key the trend runs along (e.g. num_workers)
    value: float = 0.0  # the bound of ratio, threshold and gap_closed
    published: str = ""  # the paper's number or wording, beside ours
    source: str = ""  # where the published value comes from

    def check(self, where: str) -> None:
        def bad(key: str, value: object, valid: str) -> ConfigError:
            return ConfigError(f"{where}.{key} must be {valid}, got {value!r}")

        if not self.id:
            raise bad("id", self.id, "a non-empty name")
        if self.kind not in KINDS:
            raise bad("kind", self.kind, f"one of {', '.join(KINDS)}")
        if self.better not in DIRECTIONS:
            raise bad("better", self.better, f"one of {', '.join(DIRECTIONS)}")
        if self.kind != "diverges" and not self.metric:
            raise bad("metric", self.metric, f"a run metric for kind={self.kind}")
        if not self.a:
            raise bad("a", self.a, "a run selector (e.g. {algorithm: dssp})")
        if self.kind in ("ordering", "ratio", "gap_closed") and not self.b:
            raise bad("b", self.b, f"a run selector for kind={self.kind}")
        if self.kind == "gap_closed" and not self.c:
            raise bad("c", self.c, "a run selector for kind=gap_closed")
        if self.kind == "trend" and not self.over:
            raise bad("over", self.over, "a key (e.g. num_workers) for kind=trend")
        if self.metric == "time_to_target":
            if self.target is None:
                raise bad("target", None, "{split, key, value} for metric=time_to_target")
            if self.target.key not in TARGET_KEYS:
                raise bad("target.key", self.target.key, f"one of {', '.join(TARGET_KEYS)}")
            if self.better != "lower":
                raise bad("better", self.better, "lower for metric=time_to_target")


@dataclasses.dataclass
class SweepConfig:
    name: str = ""  # the sweep's name (its file under sweeps/); empty = not a paper sweep
    paper: str = ""  # authors, title, venue
    scale: str = "small"  # small: CPU, minutes; full: the paper's scale, a GPU cluster
    # values the sweep's arms share by interpolation (e.g. a sample size set per setup:
    # `sample_size: ${sweep.params.beta}`)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    claims: list[ClaimConfig] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"sweep.scale must be one of {', '.join(SCALES)}, got {self.scale!r}")
        seen: set[str] = set()
        for i, claim in enumerate(self.claims):
            if isinstance(claim, ClaimConfig):  # OmegaConf builds the list after __post_init__
                claim.check(f"sweep.claims[{i}]")
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

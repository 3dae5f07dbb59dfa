"""A claim's sides paired by seed: the runs a side selects, one per seed (two runs of one
seed are a ClaimError), each seed's number (claim_metrics) or why that seed is unusable, and
the notes a side's flagged numbers add to a verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from stalebench.report.claim_metrics import USABLE, Value, metric
from stalebench.report.claim_selection import ClaimError
from stalebench.sweep import ClaimConfig


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


def _flag_notes(name: str, side: Side, caveats: list[str]) -> list[str]:
    """One note per caveat of a side's seeds (a target met at t = 0, a blow-up after it),
    the caveats added to `caveats`."""
    notes = []
    for seed, v in side.values.items():
        for short, what in v.flags.items():
            notes.append(f"{name}: seed {seed} {what}")
            caveats.append(short)
    return notes

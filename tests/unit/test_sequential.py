"""The pre-declared second stage (sweep.sequential): looks at 5, 10, 15, 20 seeds, the
family's α split over them (0.025 at look 1, 0.025 / 3 at each later look), Holm over the
family at every look with a claim decided earlier entering with p 0 or 1. Its error rate is
simulated through the evaluator's own look-by-look judgement (claims._sequential) on rows
as the sweeper leaves them: a claim's later seeds are judged only while it is open."""

import math

import numpy as np
import pandas as pd
import pytest

from stalebench.errors import ConfigError
from stalebench.report import claims as C
from stalebench.report.collect import CURVE_COLUMNS
from stalebench.sweep import SequentialConfig, claim_from_dict

EMPTY = pd.DataFrame(columns=CURVE_COLUMNS)


def test_the_looks_and_their_alpha_split():
    looks = SequentialConfig().looks(5)
    assert [n for n, _ in looks] == [5, 10, 15, 20]
    assert looks[0][1] == 0.025 and all(a == pytest.approx(0.025 / 3) for _, a in looks[1:])
    assert sum(a for _, a in looks) == pytest.approx(C.ALPHA)
    assert SequentialConfig(block=4, max_seeds=12).looks(5) == [
        (5, 0.025), (9, 0.0125), (12, 0.0125)
    ]  # fmt: skip
    # no room for a block: one look at the whole α, as before there was a second stage
    assert SequentialConfig(max_seeds=5).looks(5) == [(5, C.ALPHA)]
    assert SequentialConfig(max_seeds=0).looks(3) == [(3, C.ALPHA)]


@pytest.mark.parametrize(
    ("key", "value"), [("block", 0), ("max_seeds", -1), ("alpha_first", 0.05), ("alpha_first", 0)]
)
def test_a_bad_sequential_block_is_refused_by_key(key, value):
    with pytest.raises(ConfigError, match=f"sweep.sequential.{key}"):
        SequentialConfig(**{key: value})


def claims(m: int, margin: float = 0.0) -> list:
    return [
        claim_from_dict({"id": f"c{i}", "origin": "paper", "metric": "score", "better": "higher",
                         "margin": margin, "a": {"algorithm": f"a{i}"},
                         "b": {"algorithm": f"b{i}"}})
        for i in range(m)
    ]  # fmt: skip


def rows_of(d: np.ndarray, first: int = 5, block: int = 5) -> list[dict]:
    """Rows of claims whose per-seed advantage is d[claim, seed] (b scores 0), seed s in
    look 1 + (s − first) // block after the first `first` seeds."""
    rows = []
    for i, ds in enumerate(d):
        for s, x in enumerate(ds):
            look = 1 if s < first else 2 + (s - first) // block
            for side, score in ((f"a{i}", float(x)), (f"b{i}", 0.0)):
                rows.append({"sweep": "s", "algorithm": side, "seed": s,
                             "status": "completed", "score": score, "sweep.look": look,
                             "run_dir": f"{side}/{s}"})  # fmt: skip
    return rows


def judge(d: np.ndarray, family: list, sequential: SequentialConfig) -> dict[str, dict]:
    sweep = {"claims": family, "sequential": sequential}
    return {c.id: j for c, j in C._sequential(sweep, rows_of(d), EMPTY)}


def holds_rate(trials: int, m: int, effect: float, sequential: SequentialConfig, seed=11):
    rng = np.random.default_rng(seed)
    family = claims(m)
    wins = 0
    for _ in range(trials):
        d = effect + rng.standard_normal((m, 20))
        wins += any(j["verdict"] == "holds" for j in judge(d, family, sequential).values())
    return wins / trials


def bound(n: int, alpha: float = C.ALPHA) -> float:
    return alpha + 2 * math.sqrt(alpha * (1 - alpha) / n)


@pytest.mark.parametrize(("m", "trials"), [(1, 2000), (4, 500)])
def test_over_all_looks_a_null_family_holds_at_most_alpha_of_the_time(m, trials):
    # the advantage's true mean is the margin itself: every "holds" is an error (measured
    # with 10⁵ trials by benchmarks/sequential_error.py: 3.9 % for one claim)
    rate = holds_rate(trials, m, 0.0, SequentialConfig())
    assert rate <= bound(trials), rate


def test_testing_every_look_at_the_whole_alpha_would_not_keep_it():
    # the same looks at α = 0.05 each (no split): the error rate the split prevents
    rng = np.random.default_rng(5)
    errors = 0
    for _ in range(1500):
        d = rng.standard_normal(20)
        errors += any(C.one_sided(d[:n], 0.0)[2] < 0.05 for n in (5, 10, 15, 20))
    assert errors / 1500 > 0.08


def test_a_real_effect_is_found_more_often_with_the_second_stage():
    # 0.6 sd beyond the margin: at 5 seeds alone (α 0.05) found a third of the time (0.33
    # here), with the looks to 20 seeds 0.62
    one_look = holds_rate(400, 1, 0.6, SequentialConfig(max_seeds=0))
    staged = holds_rate(400, 1, 0.6, SequentialConfig())
    assert staged > one_look + 0.2, (one_look, staged)


def test_a_claim_decided_at_a_look_stops_there_and_an_open_one_goes_on():
    rng = np.random.default_rng(2)
    d = np.vstack([3.0 + 0.1 * rng.standard_normal(20),  # clear at 5 seeds
                   0.3 + rng.standard_normal(20)])  # fmt: skip
    judged = judge(d, claims(2), SequentialConfig())
    assert judged["c0"]["verdict"] == "holds" and judged["c0"]["look"] == 1
    assert judged["c0"]["n"] == 5
    assert judged["c1"]["look"] > 1 and judged["c1"]["n"] == 5 * judged["c1"]["look"]
    assert judged["c1"]["alpha"] == pytest.approx(0.025 / 3)


def test_a_look_the_sweeper_did_not_run_is_not_judged():
    d = 0.3 + np.random.default_rng(4).standard_normal((1, 5))
    judged = judge(d, claims(1), SequentialConfig())
    assert judged["c0"]["look"] == 1 and judged["c0"]["looks"] == 4
    assert judged["c0"]["alpha"] == 0.025


def test_the_minimum_detectable_effect_shrinks_with_the_seeds():
    rng = np.random.default_rng(8)
    d = rng.standard_normal(20)
    sides = [C.Side({s: C.Value(float(x)) for s, x in enumerate(d[:n])}, n) for n in (5, 20)]
    zero = C.Side({s: C.Value(0.0) for s in range(20)}, 20)
    claim = claims(1)[0]
    t5, t20 = (C.compare(claim, [s, zero]) for s in sides)
    mde5, mde20 = t5.mde(0.05), t20.mde(0.05)
    assert mde20 < mde5
    # at its own MDE a normal effect is found ~80 % of the time (the definition)
    hits = 0
    for _ in range(800):
        x = mde20 + d.std(ddof=1) * rng.standard_normal(20)
        hits += C.one_sided(x, 0.0)[2] < 0.05
    assert 0.7 < hits / 800 < 0.9

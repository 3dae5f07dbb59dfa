"""The claim rule is calibrated: on null data (no effect) it says "holds" at most α of the
time, alone and as a Holm-corrected family; the previous rule (m > sd) said so for ~11 %
at 3 seeds. Everything goes through the evaluator's own functions (compare, decide, holm)."""

import math

import numpy as np
import pytest

from stalebench.report import claims as C
from stalebench.sweep import claim_from_dict

ORDERING = {"id": "a-beats-b", "origin": "paper", "metric": "final_accuracy",
            "better": "higher", "margin": 0.0, "a": {"algorithm": "a"},
            "b": {"algorithm": "b"}}  # fmt: skip


def sides(xa, xb):
    return [C.Side({s: C.Value(float(x)) for s, x in enumerate(xs)}, len(xs)) for xs in (xa, xb)]


def holds_rate(claim, draws, family=1):
    """How often the rule says holds on `draws` (trials × family × 2 sides × seeds)."""
    wins = 0
    for trial in draws:
        tests = [C.compare(claim, sides(a, b)) for a, b in trial[:family]]
        adjusted = C.holm([t.p for t in tests])
        wins += any(C.decide([t], p) == "holds" for t, p in zip(tests, adjusted, strict=True))
    return wins / len(draws)


def bound(n, alpha=C.ALPHA):
    """α plus two binomial standard errors of a rate estimated from n trials."""
    return alpha + 2 * math.sqrt(alpha * (1 - alpha) / n)


@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("law", ["normal", "lognormal"])
def test_no_effect_holds_at_most_alpha_of_the_time(seeds, law):
    rng = np.random.default_rng(7)
    n = 2000
    draw = rng.normal if law == "normal" else rng.lognormal
    # a seed's common noise shared by both sides (pairing), then each side's own
    common = draw(size=(n, 1, 1, seeds))
    data = common + draw(size=(n, 1, 2, seeds))
    rate = holds_rate(claim_from_dict(ORDERING), [[(t[0][0], t[0][1])] for t in data])
    assert rate <= bound(n), rate


def test_the_previous_rule_said_holds_twice_as_often_on_the_same_null_data():
    rng = np.random.default_rng(7)
    d = rng.normal(size=(4000, 3)) - rng.normal(size=(4000, 3))
    m, sd = d.mean(axis=1), d.std(axis=1, ddof=1)
    old = float(((m > 0) & (m > sd)).mean())  # the m > sd rule
    new = holds_rate(claim_from_dict(ORDERING), [[(x, np.zeros(3))] for x in d])
    assert old > 0.09 and new <= bound(4000)


def test_an_effect_below_the_margin_holds_at_most_alpha_of_the_time():
    rng = np.random.default_rng(3)
    claim = claim_from_dict({**ORDERING, "margin": 0.5})
    data = [[(rng.normal(0.5, 1, 5), np.zeros(5))] for _ in range(4000)]  # exactly the margin
    assert holds_rate(claim, data) <= bound(4000)


def test_holm_keeps_a_family_of_ten_null_claims_at_alpha():
    rng = np.random.default_rng(11)
    data = [[(rng.normal(size=5), rng.normal(size=5)) for _ in range(10)] for _ in range(1500)]
    assert holds_rate(claim_from_dict(ORDERING), data, family=10) <= bound(1500)


def test_a_real_effect_is_found():
    rng = np.random.default_rng(5)
    data = [[(rng.normal(2.0, 1, 5), rng.normal(0, 1, 5))] for _ in range(500)]
    assert holds_rate(claim_from_dict(ORDERING), data) > 0.8

"""The claim rule's fast paths give scipy's numbers to the bit. The rule's one-sided t-test
computes ttest_1samp's p value with numpy and scipy.special.stdtr (claims._ttest_greater:
scipy's own call costs ~1 ms in its wrappers), remembers scipy.stats.t.ppf's quantiles
(claims._t_ppf) and looks at a selector's values once (claims.select): each is checked here
against scipy.stats (or the plain per-row comparison) on many inputs, edge cases included,
so that the Monte-Carlo checks of the rule (test_sequential.py, test_claim_rule.py) measure
the very rule a report applies."""

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from stalebench.report import claims as C


def scipy_p(d: np.ndarray, against: float) -> float:
    with warnings.catch_warnings():  # n < 2, or no spread: scipy warns, and says NaN or 0/1
        warnings.simplefilter("ignore")
        return float(stats.ttest_1samp(d, against, alternative="greater").pvalue)


def bitwise(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def samples(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """k samples of n values (rows) at scales from 1e-8 to 1e8 and offsets far from 0, a
    third of them rounded (ties), and what each is tested against: 0, a margin, its own
    mean or the offset."""
    scale = 10.0 ** rng.uniform(-8, 8, size=(k, 1))
    loc = rng.normal(size=(k, 1)) * 10.0 ** rng.uniform(-3, 6, size=(k, 1))
    d = loc + scale * rng.standard_normal((k, n))
    d[::3] = np.round(d[::3] / scale[::3], 1) * scale[::3]
    against = np.choose(rng.integers(0, 4, size=(k, 1)), [0.0, 0.5, d.mean(axis=1)[:, None], loc])
    return d, against


def test_the_t_test_p_value_is_scipys_to_the_bit_on_many_inputs():
    # scipy's test on a whole batch at once (the same reductions along each row) for
    # 1000 samples at every n from 2 to 40 (39,000), and as the rule called it, one sample
    # a call, on 40 more at each n (1,560), skewed and strided ones among them
    rng = np.random.default_rng(2024)
    for n in range(2, 41):
        d, against = samples(rng, n, 1000)
        with warnings.catch_warnings():  # nearly equal values: scipy warns of precision
            warnings.simplefilter("ignore")
            want = stats.ttest_1samp(d, against, axis=1, alternative="greater").pvalue
        for row, a, p in zip(d, against[:, 0], want, strict=True):
            assert bitwise(C._ttest_greater(row, float(a)), float(p)), (row.tolist(), a, p)
        d, against = samples(rng, n, 20)
        wide = rng.standard_normal((5, 2 * n))
        singles = [
            *zip(d, against[:, 0], strict=True),
            *((x, 1.0) for x in rng.lognormal(size=(10, n))),  # skewed
            *((x[::2], 0.0) for x in wide),  # not contiguous
            *((x[1::2], 0.25) for x in wide),
        ]
        for row, a in singles:
            a = float(a)
            assert bitwise(C._ttest_greater(row, a), scipy_p(row, a)), (row.tolist(), a)


@pytest.mark.parametrize(
    "d",
    [
        [],  # no value
        [1.5],  # n = 1: no spread to test
        [1.0, 2.0],  # n = 2
        [-3.0, 4.0],
        [2.0, 2.0],  # zero variance: t = ±inf, p 0 or 1
        [-2.0, -2.0, -2.0],
        [0.0, 0.0],  # 0 / 0
        [1.0, math.nan],  # NaN propagates
        [math.nan, math.nan, 1.0],
        [1.0, math.inf],  # infinite values: NaN
        [math.inf, math.inf],
        [-math.inf, 1.0, 2.0],
        [1e308, -1e308, 1e308],  # the deviations overflow
        [1e-300, 2e-300, 3e-300],  # subnormal spread
        [0.1, 0.1 + 1e-16, 0.1 - 1e-16],  # equal up to rounding
    ],
)
@pytest.mark.parametrize("against", [0.0, 0.5, -1.0])
def test_the_t_test_p_value_is_scipys_at_the_edges(d, against):
    d = np.array(d, dtype=float)
    assert bitwise(C._ttest_greater(d, against), scipy_p(d, against))


def test_the_rule_reports_scipys_p_and_the_edges_as_before():
    rng = np.random.default_rng(9)
    for n in (2, 3, 5, 20):
        for _ in range(100):
            d = rng.standard_normal(n)
            m, (lo, hi), p = C.one_sided(d, 0.1)
            assert p == scipy_p(d, 0.1)
            half = float(stats.t.ppf(0.975, n - 1)) * (float(d.std(ddof=1)) / math.sqrt(n))
            assert (m, lo, hi) == (float(d.mean()), m - half, m + half)
    # n = 1 and a NaN: untestable (p 1, an unbounded interval); zero variance: decided by
    # the mean alone, a tie at the margin being no lead
    assert C.one_sided(np.array([2.0]), 0.0) == (2.0, (-math.inf, math.inf), 1.0)
    nan = C.one_sided(np.array([1.0, math.nan, 2.0]), 0.0)
    assert math.isnan(nan[0]) and nan[1:] == ((-math.inf, math.inf), 1.0)
    assert C.one_sided(np.array([3.0, 3.0, 3.0]), 0.0) == (3.0, (3.0, 3.0), 0.0)
    assert C.one_sided(np.array([-3.0, -3.0]), 0.0) == (-3.0, (-3.0, -3.0), 1.0)
    assert C.one_sided(np.array([0.2, 0.2]), 0.2) == (0.2, (0.2, 0.2), 1.0)


def test_the_remembered_t_quantiles_are_scipys():
    rng = np.random.default_rng(3)
    dfs = [1.0, 2.0, 4.0, 9.0, 14.0, 19.0, 1e6, *rng.uniform(0.5, 60.0, 60)]
    qs = [0.975, 0.8, 0.95, 1 - 0.025 / 2, 1 - 0.025 / 3, 1 - 0.05 / 10, 0.5, 1e-9, 1 - 1e-9]
    for df in dfs:
        for q in qs:
            for _ in range(2):  # computed, then remembered
                assert C._t_ppf(q, float(df)) == float(stats.t.ppf(q, df)), (q, df)


def test_a_tests_interval_and_mde_use_scipys_quantiles():
    rng = np.random.default_rng(4)
    for _ in range(100):
        n = int(rng.integers(2, 21))
        t = C.Test(
            "x",
            n,
            0.0,
            float(rng.normal()),
            (0.0, 0.0),
            0.0,
            0.5,
            "paired t",
            se=float(rng.uniform(0.1, 2.0)),
            df=float(n - 1),
        )
        alpha = float(rng.choice([0.05, 0.025, 0.025 / 3, 0.05 / 7]))
        half = float(stats.t.ppf(1 - alpha / 2, t.df)) * t.se
        assert t.interval(alpha) == (t.mean - half, t.mean + half)
        k = float(stats.t.ppf(1 - alpha, t.df) + stats.t.ppf(C.POWER, t.df))
        assert t.mde(alpha) == t.against + k * t.se


def plain_select(rows, selector):
    """claims.select as it was: _same on every row and key."""
    return [r for r in rows if all(C._same(r.get(k), v) for k, v in selector.items())]


VALUES = [
    "a0",
    "b1",
    "3",
    "3.0",
    " 3 ",
    "nan",
    "inf",
    "",
    "SSP(3)",
    3,
    3.0,
    -0.0,
    0,
    1,
    True,
    False,
    math.nan,
    math.inf,
    None,
    10**400,
    2**53 + 1,
    [3, "a0"],
    ("b1",),
    {"k": 1},
]


def test_select_picks_what_the_plain_comparison_picks():
    small = [v for v in VALUES if not (isinstance(v, int) and v > 2**60)]
    rows = [{"k": v, "j": w, "i": i} for i, v in enumerate(small) for w in ("a0", 3, None)]
    rows.append({"j": "a0"})  # no k at all
    wants = [*small, [3, "nan"], ()]
    for want in wants:
        for selector in ({"k": want}, {"k": want, "j": "a0"}, {"j": 3, "k": want}):
            assert C.select(rows, selector) == plain_select(rows, selector), selector
    assert C.select(rows, {}) == rows and C.select(rows, {}) is not rows
    # an int past a float, on either side, is compared as _same compares it: against a
    # number float() of it overflows, against a name it is a string
    huge = [{"k": 10**400}]
    for want, row in ((10**400, rows), (3, huge), ("3", huge), ("a0", huge)):
        with pytest.raises(OverflowError):
            plain_select(row, {"k": want})
        with pytest.raises(OverflowError):
            C.select(row, {"k": want})
    for want, row in ((10**400, [{"k": "a0"}]), ("a0", [{"k": str(10**400)}])):
        assert C.select(row, {"k": want}) == plain_select(row, {"k": want}) == []

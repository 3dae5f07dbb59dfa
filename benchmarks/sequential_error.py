"""The second stage's error rate and power, by simulation (sweep.sequential's defaults:
looks at 5, 10, 15, 20 seeds, α 0.025 then 0.025 / 3 per later look).

    python -m benchmarks.sequential_error [--trials 100000]

One claim: per-seed advantages ~ N(effect, 1) against a margin of 0, judged look by look
as stalebench.report.claim_judge judges them (holds: one-sided p < α_k; does not hold: the
(1 − α_k) interval below the margin; a decided claim stops), vectorized over trials and
checked against the evaluator's own look-by-look judgement on the first trials. A family
of claims (Holm at every look, decided claims entering with p 0 or 1) goes through the
evaluator itself. Printed: the rate of "holds" (an error when effect = 0), "does not hold",
and the mean number of seeds a claim used.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats

from stalebench.sweep import SequentialConfig


def one_claim(d: np.ndarray, looks: list[tuple[int, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Verdict per trial (1 holds, -1 does not hold, 0 inconclusive) and seeds used."""
    verdict = np.zeros(len(d), dtype=int)
    used = np.zeros(len(d), dtype=int)
    for n, alpha in looks:
        open_ = verdict == 0
        x = d[open_, :n]
        m, se = x.mean(axis=1), x.std(axis=1, ddof=1) / np.sqrt(n)
        t = m / se
        p = stats.t.sf(t, n - 1)
        upper = m + stats.t.ppf(1 - alpha / 2, n - 1) * se
        v = np.where(p < alpha, 1, np.where(upper < 0, -1, 0))
        used[open_] = n
        verdict[open_] = v
    return verdict, used


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--family-trials", type=int, default=2000)
    args = parser.parse_args(argv)
    looks = SequentialConfig().looks(5)
    print(f"looks: {[(n, round(a, 5)) for n, a in looks]}")
    rng = np.random.default_rng(0)
    print("one claim (advantage ~ N(effect, 1), margin 0):")
    print("  effect  holds  (5 seeds, α 0.05)  does-not-hold  mean seeds")
    for effect in (0.0, 0.3, 0.6, 1.0, -0.5):
        d = effect + rng.standard_normal((args.trials, looks[-1][0]))
        v, used = one_claim(d, looks)
        single, _ = one_claim(d, [(5, 0.05)])
        print(f"  {effect:6.1f}  {np.mean(v == 1):.4f}  ({np.mean(single == 1):.4f})"
              f"              {np.mean(v == -1):.4f}        {used.mean():.1f}")  # fmt: skip

    # the evaluator itself: the same decisions on the first trials, and a family of 5
    from tests.unit.test_sequential import claims, holds_rate, judge

    d = rng.standard_normal((200, looks[-1][0]))
    v, _ = one_claim(d, looks)
    family = claims(1)
    theirs = [judge(x[None, :], family, SequentialConfig())["c0"]["verdict"] for x in d]
    code = {"holds": 1, "does not hold": -1, "inconclusive": 0}
    agree = sum(code[t] == int(o) for t, o in zip(theirs, v, strict=True))
    print(f"evaluator agrees with the vectorized rule on {agree} of {len(d)} trials")
    rate = holds_rate(args.family_trials, 5, 0.0, SequentialConfig(), seed=1)
    print(
        f"family of 5 null claims (Holm at each look): any holds {rate:.4f} "
        f"({args.family_trials} trials)"
    )


if __name__ == "__main__":
    main()

"""The claim evaluator on synthetic run directories whose verdicts are known by construction:
holds, does not hold, inconclusive, not run, failed runs, censored times, divergence, gaps,
trends and per-value expansion; the report writes claims.json and prints every verdict."""

import json

import pytest
import yaml

from stalebench.errors import ConfigError
from stalebench.report import claims as C
from stalebench.report.cli import main as report_main
from stalebench.report.collect import collect
from stalebench.sweep import SweepConfig, claim_from_dict

CLAIMS = [
    # a=fast beats b=slow on final accuracy by far more than the seeds' spread
    {"id": "fast-beats-slow", "metric": "final_accuracy", "better": "higher",
     "a": {"algorithm": "fast"}, "b": {"algorithm": "slow"}},
    # the reverse claim, so it does not hold
    {"id": "slow-beats-fast", "metric": "final_accuracy", "better": "higher",
     "a": {"algorithm": "slow"}, "b": {"algorithm": "fast"}},
    # noisy vs fast: the means differ by less than the spread
    {"id": "noisy-beats-fast", "metric": "final_accuracy", "better": "higher",
     "a": {"algorithm": "noisy"}, "b": {"algorithm": "fast"}},
    # an arm that was never run
    {"id": "ghost-beats-fast", "metric": "final_accuracy", "better": "higher",
     "a": {"algorithm": "ghost"}, "b": {"algorithm": "fast"}},
    # time to test accuracy 0.5: fast reaches it at t=1, slow at t=3, never (censored) for seed 2
    {"id": "fast-sooner", "metric": "time_to_target",
     "target": {"split": "test", "key": "accuracy", "value": 0.5},
     "a": {"algorithm": "fast"}, "b": {"algorithm": "slow"}},
    {"id": "slow-sooner", "metric": "time_to_target",
     "target": {"split": "test", "key": "accuracy", "value": 0.5},
     "a": {"algorithm": "slow"}, "b": {"algorithm": "fast"}},
    {"id": "boom-diverges", "kind": "diverges", "a": {"algorithm": "boom"}},
    {"id": "fast-diverges", "kind": "diverges", "a": {"algorithm": "fast"}},
    # fast goes (0.9 − 0.3)/(0.9 − 0.3) of the way from slow to itself: fraction 1 ≥ 0.5
    {"id": "gap", "kind": "gap_closed", "metric": "final_accuracy", "better": "higher",
     "value": 0.5, "a": {"algorithm": "fast"}, "b": {"algorithm": "slow"},
     "c": {"algorithm": "fast"}},
    {"id": "ratio", "kind": "ratio", "metric": "final_accuracy", "better": "lower",
     "value": 0.5, "a": {"algorithm": "slow"}, "b": {"algorithm": "fast"}},
    # the seeds fast completed (its failed seed 5 would be a lost seed: inconclusive)
    {"id": "threshold", "kind": "threshold", "metric": "final_accuracy", "better": "higher",
     "value": 0.8, "a": {"algorithm": "fast"}, "where": {"seed": [0, 1, 2, 3, 4]}},
    # accuracy falls with N for "scaly" (0.9 at N=1, 0.5 at N=8)
    {"id": "degrades", "kind": "trend", "metric": "final_accuracy", "better": "lower",
     "over": "num_workers", "a": {"algorithm": "scaly"}},
    # scaly's lead over flat shrinks from +0.2 at N=1 to −0.2 at N=8: it does not widen
    {"id": "margin-widens", "kind": "trend", "metric": "final_accuracy", "better": "higher",
     "over": "num_workers", "a": {"algorithm": "scaly"}, "b": {"algorithm": "flat"}},
    {"id": "per-n", "metric": "final_accuracy", "better": "higher", "per": "num_workers",
     "a": {"algorithm": "scaly"}, "b": {"algorithm": "flat"}},
    {"id": "config-key", "metric": "final_accuracy", "better": "higher",
     "a": {"algorithm": "fast", "algorithm.barrier.staleness": 3}, "b": {"algorithm": "slow"}},
    # a check of the harness itself: its own Holm family, apart from the paper's tally
    {"id": "self", "metric": "final_accuracy", "better": "higher", "origin": "self-check",
     "a": {"algorithm": "fast"}, "b": {"algorithm": "slow"}},
]  # fmt: skip
for _claim in CLAIMS:
    _claim.setdefault("origin", "paper")
    _claim.setdefault("margin", 0.0)
    _claim.setdefault("better", "lower")
SEEDS = range(5)


def run_dir(root, name, algorithm, seed, accuracy, *, status="completed", n=4, curve=None):
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    config = {
        "algorithm": {"name": algorithm, "barrier": {"staleness": 3}},
        "seed": seed,
        "sweep": {"name": "toy", "paper": "A. Toy (2026)", "scale": "small", "claims": CLAIMS},
    }
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    curve = curve or [(0.0, 0.1), (5.0, accuracy)]
    events = [
        {"kind": "eval", "t": t, "version": i, "split": "test", "loss": 1.0 - a, "accuracy": a}
        for i, (t, a) in enumerate(curve)
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    summary = {
        "status": status,
        "error": None if status == "completed" else f"{status} on purpose",
        "algorithm": algorithm,
        "cluster": "homogeneous",
        "num_workers": n,
        "seed": seed,
        "wall_time_s": 5.0,
        "final": None if status == "failed" else {"accuracy": accuracy, "loss": 1 - accuracy},
    }
    # of two evaluations the end of the curve is the last one (as summarize writes it)
    end = summary["final"] if status == "completed" else None
    summary["final_tail"] = {**end, "evals": 1} if end else None
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture()
def sweep(tmp_path):
    for s in SEEDS:
        run_dir(tmp_path, f"fast{s}", "fast", s, 0.9 + 0.01 * s, curve=[(0, 0.1), (1, 0.6)])
        slow_curve = [(0, 0.1), (3 + 0.1 * s, 0.55)] if s < 2 else [(0, 0.1), (5, 0.3)]
        run_dir(tmp_path, f"slow{s}", "slow", s, 0.3 + 0.01 * s, curve=slow_curve)
        run_dir(tmp_path, f"noisy{s}", "noisy", s, [0.5, 0.99, 1.3, 0.4, 1.2][s])
        run_dir(tmp_path, f"boom{s}", "boom", s, 0.1, status="diverged")
        for n, acc in ((1, 0.9), (8, 0.5)):
            run_dir(tmp_path, f"scaly{n}-{s}", "scaly", s, acc + 0.01 * s, n=n)
            run_dir(tmp_path, f"flat{n}-{s}", "flat", s, 0.7 + 0.01 * s, n=n)
    run_dir(tmp_path, "fast-failed", "fast", 5, 0.0, status="failed")
    return tmp_path


def verdicts(path):
    runs, curves, _ = collect([path])
    return {(v["id"], v["scope"]): v for v in C.evaluate(runs, curves)}


def test_every_verdict_is_what_the_synthetic_runs_were_built_to_give(sweep):
    v = verdicts(sweep)
    got = {key: r["verdict"] for key, r in v.items()}
    assert got == {
        ("fast-beats-slow", ""): "holds",
        ("slow-beats-fast", ""): "does not hold",
        ("noisy-beats-fast", ""): "inconclusive",
        ("ghost-beats-fast", ""): "not run",
        ("fast-sooner", ""): "holds",  # slow's censored seed only makes fast's lead larger
        ("slow-sooner", ""): "does not hold",
        ("boom-diverges", ""): "holds",
        ("fast-diverges", ""): "does not hold",
        ("gap", ""): "holds",  # fast goes all the way (fraction 1) from slow to itself
        ("ratio", ""): "holds",
        ("threshold", "seed=[0, 1, 2, 3, 4]"): "holds",
        ("degrades", "every step of num_workers"): "holds",
        ("margin-widens", "every step of num_workers"): "does not hold",
        ("per-n", "every num_workers"): "does not hold",  # one joint verdict: not at N=8
        ("config-key", ""): "holds",
        ("self", ""): "holds",
    }
    assert v[("degrades", "every step of num_workers")]["verdict"] == "holds"


def test_the_failed_run_is_reported_not_dropped(sweep):
    v = verdicts(sweep)[("fast-beats-slow", "")]
    assert "a: seed 5 unusable (failed)" in v["notes"]
    assert v["n"] == 5


def test_a_censored_a_side_cannot_make_a_claim_hold():
    claim = claim_from_dict(CLAIMS[4])  # fast sooner than slow
    never = C.Side({s: C.Value(6.0, censored=True) for s in SEEDS}, 5)
    quick = C.Side({s: C.Value(1.0 + 0.01 * s * s) for s in SEEDS}, 5)
    test = C.compare(claim, [quick, never])  # sooner than a never-reaching b: may hold
    assert C.decide([test], test.p) == "holds"
    test = C.compare(claim, [never, quick])
    assert C.decide([test], test.p) == "does not hold"  # a's true time is later still
    both = C.Side({s: C.Value(1.0 + 0.01 * s * s, censored=s == 0) for s in SEEDS}, 5)
    test = C.compare(claim, [both, C.Side({s: C.Value(3.0 + 0.1 * s) for s in SEEDS}, 5)])
    assert test.p < 0.05 and C.decide([test], test.p) == "inconclusive"


def test_the_test_at_its_boundaries():
    lead = C.one_sided([1.0, 1.2, 0.9, 1.1, 1.05], 0.0)
    assert lead[2] < 0.001 and lead[1][0] > 0  # a clear lead: small p, interval above 0
    small = C.one_sided([1.0, 1.2, 0.9, 1.1, 1.05], 1.0)  # ... but not beyond a margin of 1
    assert small[2] > 0.05 and small[1][0] < 1.0 < small[1][1]
    assert C.one_sided([0.5, 0.5, 0.5], 0.0) == (0.5, (0.5, 0.5), 0.0)  # deterministic
    assert C.one_sided([0.0, 0.0, 0.0], 0.0)[2] == 1.0  # a tie is not a win
    assert C.one_sided([5.0], 0.0)[2] == 1.0  # one seed tests nothing
    claim = claim_from_dict({**CLAIMS[0], "margin": 0.05})
    a = C.Side({s: C.Value(0.60 + 0.01 * (s % 2)) for s in SEEDS}, 5)
    b = C.Side({s: C.Value(0.58 + 0.01 * (s % 3)) for s in SEEDS}, 5)
    test = C.compare(claim, [a, b])  # a leads by ~0.015: below the margin of 0.05
    assert test.fails and C.decide([test], test.p) == "does not hold"
    short = C.compare(claim_from_dict({**CLAIMS[0], "min_seeds": 6}), [a, b])
    assert short.short and C.decide([short], 0.0) == "inconclusive"


def test_unpaired_sides_take_welchs_test_of_the_contrast():
    from scipy import stats

    claim = claim_from_dict(CLAIMS[0])
    xa, xb = [0.9, 0.8, 0.85, 0.95], [0.3, 0.4, 0.35, 0.5, 0.45]
    a = C.Side({i: C.Value(x) for i, x in enumerate(xa)}, 4)
    b = C.Side({10 + i: C.Value(x) for i, x in enumerate(xb)}, 5)
    test = C.compare(claim, [a, b])
    assert test.test == "Welch t" and "unpaired" in test.label
    want = stats.ttest_ind(xa, xb, equal_var=False, alternative="greater").pvalue
    assert test.p == pytest.approx(want)
    # a ratio a / b ≥ 2 is the contrast a − 2·b > 0
    ratio = claim_from_dict({**CLAIMS[9], "better": "higher", "value": 2.0})
    test = C.compare(ratio, [a, b])
    assert test.estimate == pytest.approx(sum(xa) / 4 / (sum(xb) / 5))
    assert test.mean == pytest.approx(sum(xa) / 4 - 2 * sum(xb) / 5)


def test_the_report_writes_claims_json_and_prints_every_verdict(sweep, capsys):
    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    printed = capsys.readouterr().out
    data = json.loads((sweep / "report" / "claims.json").read_text())
    assert data["rule"] == C.RULE
    assert data["alpha"] == 0.05 and data["correction"] == "holm"
    assert len(data["claims"]) == 16
    paper = [v for v in data["claims"] if v["origin"] == "paper" and v["p"] is not None]
    ps = [v["p"] for v in paper]
    assert [v["p_holm"] for v in paper] == pytest.approx(C.holm(ps))
    (self_check,) = [v for v in data["claims"] if v["origin"] == "self-check"]
    assert self_check["p_holm"] == self_check["p"]  # a family of one
    for v in data["claims"]:
        assert f"{v['verdict']:>14}  toy/{v['id']}" in printed
    report = (sweep / "report" / "report.md").read_text()
    assert "## Claims" in report and "### toy (small): A. Toy (2026)" in report


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ({"id": "x", "metric": "m", "kind": "best"}, "kind must be one of"),
        ({"id": "x", "metric": "m", "a": {"algorithm": "a"}}, "b must be a run selector"),
        ({"id": "x", "kind": "trend", "metric": "m", "a": {"k": 1}}, "over must be a key"),
        ({"id": "x", "metric": "time_to_target", "a": {"k": 1}, "b": {"k": 2}}, "target must"),
        ({"id": "x", "metric": "m", "a": {"k": 1}, "b": {"k": 2}, "colour": 1}, "unknown keys"),
    ],
)
def test_a_malformed_claim_is_rejected_naming_the_key(claim, message):
    with pytest.raises(ConfigError, match=message):
        claim_from_dict(
            {"origin": "paper", "margin": 0.0, "better": "lower", **claim}, "sweep.claims[0]"
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"origin": ""}, r"origin must be one of paper, recalled, self-check, got ''"),
        ({"origin": "memory"}, "origin must be one of"),
        ({"threshold_from": "them"}, "threshold_from must be one of paper, ours"),
        ({"margin": -0.1}, r"margin must be >= 0, got -0.1"),
        ({"min_seeds": 1}, r"min_seeds must be >= 2"),
    ],
)
def test_a_claim_states_its_provenance_and_margin(fields, message):
    with pytest.raises(ConfigError, match=message):
        claim_from_dict({**CLAIMS[0], **fields}, "sweep.claims[0]")


def test_two_claims_with_one_id_are_rejected():
    claim = claim_from_dict(CLAIMS[0])
    with pytest.raises(ConfigError, match="used twice"):
        SweepConfig(name="toy", claims=[claim, claim])


# kind=reproduces: a published number (here 100 s) against ours, within a tolerance of ×1.5
PUBLISHED = {"id": "published", "kind": "reproduces", "metric": "wall_time_s", "value": 100.0,
             "tolerance": 1.5, "better": "lower", "margin": 0.0, "origin": "paper",
             "a": {"algorithm": "x"}}  # fmt: skip


def published_rows(*runs):
    """Rows of arm x, one per (seed, wall_time_s[, status])."""
    return [{"algorithm": "x", "seed": seed, "wall_time_s": t, "status": status}
            for seed, t, status in ((r + ("completed",))[:3] for r in runs)]  # fmt: skip


@pytest.mark.parametrize(
    ("runs", "verdict", "ours"),
    [
        # bit-identical seeds (deterministic runs): one measurement, counted once
        ([(0, 140.0), (1, 140.0)], "holds", "ours / theirs 1.4, tolerance ×1.5; one measurement"),
        ([(0, 140.0), (1, 145.0)], "holds", "(runs 1.4 to 1.45), tolerance ×1.5; 2 of 2 runs"),
        ([(0, 70.0), (1, 70.0), (2, 70.0)], "holds", "ours / theirs 0.7"),  # 1/1.5 = 0.667
        ([(0, 160.0), (1, 160.0)], "does not hold", "ours / theirs 1.6"),
        ([(0, 60.0), (1, 60.0)], "does not hold", "ours / theirs 0.6"),
        ([(0, 120.0), (1, 200.0)], "inconclusive", "(runs 1.2 to 2), tolerance ×1.5; 1 of 2"),
        ([(0, 120.0)], "inconclusive", "1 of 1 runs"),  # fewer than min_seeds=2
        ([(0, 120.0), (1, 121.0), (2, 5.0, "failed")], "inconclusive", "2 of 2 runs"),
        ([(0, 120.0), (1, 121.0), (2, 5.0, "diverged")], "inconclusive", "2 of 2 runs"),
        ([], "not run", ""),
    ],
    ids=[
        "above",
        "above-two",
        "below",
        "too-high",
        "too-low",
        "mixed",
        "one-run",
        "a-failed-run",
        "a-diverged-run",
        "none",
    ],
)
def test_reproduces_counts_the_runs_within_the_tolerance_of_the_published_number(
    runs, verdict, ours
):
    claim = claim_from_dict({**PUBLISHED, "min_seeds": 2}, "sweep.claims[0]")
    other = [{**r, "algorithm": "y"} for r in published_rows(*runs)]  # another arm's runs
    got = C.judge(claim, published_rows(*runs) + other, None)
    assert got["verdict"] == verdict and ours in got["ours"] and got["tests"] == []
    if any(len(r) == 3 for r in runs):  # the lost run is named, not dropped
        assert "seed 2: " in got["notes"] and "lost runs" in got["notes"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"value": 0.0}, "value must be the published number"),
     ({"tolerance": 1.0}, "tolerance must be a ratio > 1"),
     ({"tolerance": 0.0}, "tolerance must be a ratio > 1")],
)  # fmt: skip
def test_a_reproduces_claim_states_the_published_number_and_a_tolerance(fields, message):
    with pytest.raises(ConfigError, match=message):
        claim_from_dict({**PUBLISHED, **fields}, "sweep.claims[0]")


# kind=reproduces with b and over: a published "as much as x % faster" (here 25 %): a's gain
# over b on each seed, at its best over the values of `over`
GAIN = {**PUBLISHED, "metric": "throughput", "better": "higher", "value": 0.25,
        "a": {"algorithm": "x"}, "b": {"algorithm": "y"}, "over": "bw", "min_seeds": 2}  # fmt: skip


def gain_rows(points, seeds=(0, 1), metric="throughput", skip=()):
    """Rows of arms x and y at each bw of `points` ({bw: (x's metric, y's)}) and seed; the
    (arm, seed, bw) in `skip` have no run."""
    return [{"algorithm": arm, "seed": seed, "bw": bw, metric: v, "status": "completed"}
            for seed in seeds for bw, pair in points.items()
            for arm, v in zip("xy", pair, strict=True)
            if (arm, seed, bw) not in skip]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "points", "skip", "verdict", "ours"),
    [
        (
            {},
            {1: (1.1, 1.0), 4: (1.3, 1.0), 16: (1.05, 1.0)},
            (),
            "holds",
            "the best throughput gain of a over b over bw (1: 0.1, 4: 0.3, 16: 0.05) 0.3 against "
            "0.25: ours / theirs 1.2",
        ),
        ({"over": ""}, {4: (1.3, 1.0)}, (), "holds", "throughput gain of a over b 0.3"),
        ({}, {1: (1.1, 1.0), 4: (1.5, 1.0)}, (), "does not hold", "ours / theirs 2"),
        ({}, {1: (0.9, 1.0), 4: (0.95, 1.0)}, (), "does not hold", "ours / theirs -0.2"),
        # a time: the gain is b / a − 1 (b took 1.3 × a's time: a is 30 % faster)
        (
            {"metric": "wall_time_s", "better": "lower"},
            {1: (1.0, 1.3)},
            (),
            "holds",
            "ours / theirs 1.2",
        ),
        # seed 1 has no b at bw=16, where its best might have been: lost, not dropped
        (
            {},
            {1: (1.1, 1.0), 4: (1.3, 1.0), 16: (1.05, 1.0)},
            (("y", 1, 16),),
            "inconclusive",
            "1 of 1 seeds",
        ),
        # a speed-up (relative: factor): a / b itself, as a published "53X": 1.3 / 1.0
        # against 1.25
        (
            {"relative": "factor", "value": 1.25, "over": ""},
            {4: (1.3, 1.0)},
            (),
            "holds",
            "throughput factor of a over b 1.3 against 1.25: ours / theirs 1.04",
        ),
        # a time's factor is b / a: b took 4 × a's time, a speed-up of 4 against 8
        (
            {
                "relative": "factor",
                "value": 8.0,
                "over": "",
                "metric": "wall_time_s",
                "better": "lower",
            },
            {4: (1.0, 4.0)},
            (),
            "does not hold",
            "ours / theirs 0.5",
        ),
    ],
    ids=[
        "best-over",
        "one-point",
        "too-high",
        "slower",
        "a-time",
        "a-seed-lost",
        "factor",
        "a-time-factor",
    ],
)
def test_reproduces_takes_a_gain_over_b_at_its_best_over_a_key(fields, points, skip, verdict, ours):
    claim = claim_from_dict({**GAIN, **fields}, "sweep.claims[0]")
    rows = gain_rows(points, metric=claim.metric, skip=skip)
    got = C.judge(claim, rows, None)
    assert got["verdict"] == verdict and ours in got["ours"], got
    if skip:
        assert "b seed 1 at bw=16: no run" in got["notes"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"relative": "ratio"}, "relative must be one of gain, factor, got 'ratio'"),
     ({"relative": "factor", "b": {}}, "relative must be gain .* without b, got 'factor'")],
)  # fmt: skip
def test_a_reproduces_claim_names_how_a_is_set_against_b(fields, message):
    with pytest.raises(ConfigError, match=message):
        claim_from_dict({**GAIN, **fields}, "sweep.claims[0]")


def test_a_reproduces_claim_is_one_published_number():
    with pytest.raises(ConfigError, match="per must be unset for kind=reproduces"):
        claim_from_dict({**GAIN, "per": "model.name"}, "sweep.claims[0]")

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
    {"id": "threshold", "kind": "threshold", "metric": "final_accuracy", "better": "higher",
     "value": 0.8, "a": {"algorithm": "fast"}},
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
]  # fmt: skip


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
    (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture()
def sweep(tmp_path):
    for s in range(3):
        run_dir(tmp_path, f"fast{s}", "fast", s, 0.9 + 0.01 * s, curve=[(0, 0.1), (1, 0.6)])
        slow_curve = [(0, 0.1), (3, 0.55)] if s < 2 else [(0, 0.1), (5, 0.3)]
        run_dir(tmp_path, f"slow{s}", "slow", s, 0.3 + 0.01 * s, curve=slow_curve)
        run_dir(tmp_path, f"noisy{s}", "noisy", s, [0.5, 0.99, 1.3][s])
        run_dir(tmp_path, f"boom{s}", "boom", s, 0.1, status="diverged")
        for n, acc in ((1, 0.9), (8, 0.5)):
            run_dir(tmp_path, f"scaly{n}-{s}", "scaly", s, acc + 0.01 * s, n=n)
            run_dir(tmp_path, f"flat{n}-{s}", "flat", s, 0.7 + 0.01 * s, n=n)
    run_dir(tmp_path, "fast-failed", "fast", 3, 0.0, status="failed")
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
        ("threshold", ""): "holds",
        ("degrades", ""): "holds",
        ("margin-widens", ""): "does not hold",
        ("per-n", "num_workers=1"): "holds",
        ("per-n", "num_workers=8"): "does not hold",
        ("config-key", ""): "holds",
    }


def test_the_failed_run_is_reported_not_dropped(sweep):
    v = verdicts(sweep)[("fast-beats-slow", "")]
    assert "a: 1 of 4 runs unusable" in v["notes"]
    assert v["n"] == 3


def test_a_censored_a_side_cannot_make_a_claim_hold(tmp_path):
    claim = claim_from_dict(CLAIMS[4])  # fast sooner than slow
    fast = C.Side({0: C.Value(6.0, censored=True), 1: C.Value(6.0, True)}, 2, 0)
    slow = C.Side({0: C.Value(1.0), 1: C.Value(1.2)}, 2, 0)
    o = C._outcome(claim, [slow, fast])  # slow sooner than a never-reaching fast: holds
    assert C._censor(C.rule(o.m, o.sd, o.n), o.a_censored, o.b_censored) == "holds"
    o = C._outcome(claim, [fast, slow])
    assert C.rule(o.m, o.sd, o.n) == "does not hold"  # and stays so: fast's true time is later
    both = C._outcome(claim, [C.Side({0: C.Value(9, True), 1: C.Value(1, True)}, 2, 0), slow])
    assert C._censor("holds", both.a_censored, both.b_censored) == "inconclusive"


def test_the_rule_at_its_boundaries():
    assert C.rule(1.0, 0.5, 3) == "holds"
    assert C.rule(1.0, 1.0, 3) == "inconclusive"  # the lead must exceed the spread
    assert C.rule(0.0, 0.0, 3) == "does not hold"  # a tie is not a win
    assert C.rule(-1.0, 1.0, 3) == "does not hold"
    assert C.rule(-0.5, 1.0, 3) == "inconclusive"
    assert C.rule(5.0, float("nan"), 1) == "inconclusive"  # one seed has no spread
    assert C.rule(float("nan"), float("nan"), 0) == "not run"


def test_unpaired_sides_combine_their_spreads():
    claim = claim_from_dict(CLAIMS[0])
    a = C.Side({0: C.Value(0.9), 1: C.Value(0.8)}, 2, 0)
    b = C.Side({5: C.Value(0.3), 6: C.Value(0.4)}, 2, 0)
    o = C._outcome(claim, [a, b])
    assert o.m == pytest.approx(0.5)
    assert o.sd == pytest.approx((0.005 + 0.005) ** 0.5)
    assert "unpaired" in o.shown


def test_the_report_writes_claims_json_and_prints_every_verdict(sweep, capsys):
    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    printed = capsys.readouterr().out
    data = json.loads((sweep / "report" / "claims.json").read_text())
    assert data["rule"] == C.RULE
    assert len(data["claims"]) == 16
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
        claim_from_dict(claim, "sweep.claims[0]")


def test_two_claims_with_one_id_are_rejected():
    claim = claim_from_dict(CLAIMS[0])
    with pytest.raises(ConfigError, match="used twice"):
        SweepConfig(name="toy", claims=[claim, claim])

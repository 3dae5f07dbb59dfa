"""The evaluator's holes, each closed: on synthetic run directories built so that the
right verdict is known, every one of these gave a wrong (or silent) verdict under the
previous rule (`m > sd`, end points, per-value rows, failed runs dropped)."""

import json

import pytest
import yaml

from stalebench.metrics.summary import finalize
from stalebench.report import claims as C
from stalebench.report.collect import collect


def write_run(root, name, claims, *, algorithm, seed, n=4, status="completed", final=None,
              curve=None, **summary):  # fmt: skip
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    config = {
        "algorithm": {"name": algorithm},
        "seed": seed,
        "cluster": {"num_workers": n},
        "sweep": {"name": "holes", "paper": "Holes", "scale": "small", "claims": claims},
    }
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    curve = curve or [(0.0, 0.1), (5.0, (final or {}).get("accuracy", 0.5))]
    events = [  # a point is (t, accuracy) with loss 1 − accuracy, or (t, accuracy, loss)
        {"kind": "eval", "t": p[0], "version": i, "split": "test", "accuracy": p[1],
         "loss": p[2] if len(p) > 2 else 1.0 - p[1]}
        for i, p in enumerate(curve)
    ]  # fmt: skip
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    body = {"status": status, "error": None, "algorithm": algorithm, "cluster": "c",
            "num_workers": n, "seed": seed, "wall_time_s": 5.0, "final": final,
            **summary}  # fmt: skip
    # the end of the curve as summarize writes it: here, the last evaluation's
    tail = final if status != "diverged" and final else None
    body.setdefault("final_tail", {**tail, "evals": 1} if tail else None)
    (d / "summary.json").write_text(json.dumps(body))


def judge(root):
    runs, curves, _ = collect([root])
    return {v["id"]: v for v in C.evaluate(runs, curves)}


def claim(**fields):
    return {"origin": "paper", "metric": "final_accuracy", "better": "higher", "margin": 0.0,
            **fields}  # fmt: skip


def test_failed_runs_never_count_as_diverged(tmp_path):
    # one run diverged, two crashed: "every run diverges" is not shown by one run
    claims = [claim(id="boom", kind="diverges", a={"algorithm": "x"})]
    write_run(tmp_path, "d0", claims, algorithm="x", seed=0, status="diverged")
    for s in (1, 2):
        write_run(tmp_path, f"f{s}", claims, algorithm="x", seed=s, status="failed")
    v = judge(tmp_path)["boom"]
    assert v["verdict"] == "inconclusive"  # was "holds": 1 of 1 usable diverged
    assert "seed 1: failed" in v["notes"] and "seed 2: failed" in v["notes"]
    assert v["ours"] == "1 of 1 runs diverged"


def test_a_seed_lost_on_either_side_is_named_and_the_claim_needs_its_minimum(tmp_path):
    # a beats b on seeds 3 and 4; on seeds 0-2 a crashed (where b may have won): two paired
    # seeds are not enough (min_seeds 3), and the lost seeds are named
    claims = [claim(id="a-beats-b", a={"algorithm": "a"}, b={"algorithm": "b"})]
    for s in range(5):
        status = "failed" if s < 3 else "completed"
        write_run(tmp_path, f"a{s}", claims, algorithm="a", seed=s, status=status,
                  final={"accuracy": 0.9 + 0.001 * s})  # fmt: skip
        write_run(tmp_path, f"b{s}", claims, algorithm="b", seed=s,
                  final={"accuracy": 0.5 + 0.001 * s})  # fmt: skip
    v = judge(tmp_path)["a-beats-b"]
    assert v["verdict"] == "inconclusive"  # was "holds" on the two seeds left
    for s in range(3):
        assert f"a: seed {s} unusable (failed)" in v["notes"]
    assert "2 usable seeds (min 3)" in v["notes"]


def test_a_selector_that_matches_two_runs_of_one_seed_is_an_error_naming_them(tmp_path):
    # b = BSP on two clusters: which of the two runs per seed the claim means is unknowable
    claims = [claim(id="vague", a={"algorithm": "a"}, b={"algorithm": "b"})]
    for s in range(3):
        write_run(tmp_path, f"a{s}", claims, algorithm="a", seed=s, final={"accuracy": 0.9})
        for cl in ("fast", "slow"):
            write_run(tmp_path, f"b{s}-{cl}", claims, algorithm="b", seed=s,
                      final={"accuracy": 0.5})  # fmt: skip
    named = r"selector b matches 2 runs of seed 0: .*b0-fast.*b0-slow"
    with pytest.raises(C.ClaimError, match=named):
        judge(tmp_path)


def test_a_trend_is_tested_at_every_step_not_at_its_end_points(tmp_path):
    # accuracy 0.80 → 0.95 → 0.79 over N = 1, 2, 4: it rises, then falls; "falls with N"
    # judged on the end points (0.80 → 0.79) held; the rise from 1 to 2 refutes it
    claims = [claim(id="falls", kind="trend", better="lower", over="num_workers",
                    a={"algorithm": "a"})]  # fmt: skip
    for s in range(5):
        for n, acc in ((1, 0.80), (2, 0.95), (4, 0.79)):
            write_run(tmp_path, f"a{n}-{s}", claims, algorithm="a", seed=s, n=n,
                      final={"accuracy": acc - 0.002 * s + 0.0013 * (s % 2) * n})  # fmt: skip
    v = judge(tmp_path)["falls"]
    assert v["verdict"] == "does not hold"
    assert [step["label"] for step in v["steps"]] == [
        "a at num_workers=2 minus at 1",
        "a at num_workers=4 minus at 2",
    ]


def test_at_every_n_is_one_joint_verdict(tmp_path):
    # a beats b clearly at N = 2 and 4, loses at N = 8: "at every N" does not hold, once
    claims = [claim(id="every-n", per="num_workers", a={"algorithm": "a"},
                    b={"algorithm": "b"})]  # fmt: skip
    for s in range(5):
        for n, lead in ((2, 0.2), (4, 0.2), (8, -0.2)):
            write_run(tmp_path, f"a{n}-{s}", claims, algorithm="a", seed=s, n=n,
                      final={"accuracy": 0.5 + lead + 0.01 * s})  # fmt: skip
            write_run(tmp_path, f"b{n}-{s}", claims, algorithm="b", seed=s, n=n,
                      final={"accuracy": 0.5 + 0.005 * s * s})  # fmt: skip
    runs, curves, _ = collect([tmp_path])
    results = C.evaluate(runs, curves)
    assert len(results) == 1  # was one row per N: two "holds" beside one "does not hold"
    assert results[0]["verdict"] == "does not hold"
    assert results[0]["scope"] == "every num_workers"
    assert len(results[0]["steps"]) == 3


def test_a_diverged_run_never_reaches_a_target_and_measures_nothing_else(tmp_path):
    # SSP diverges in every seed; its compute fraction (what it did before blowing up) must
    # not make "SSP computes more than BSP" hold; its early hit of the target is not a hit
    claims = [
        claim(id="computes-more", metric="compute_fraction", a={"algorithm": "ssp"},
              b={"algorithm": "bsp"}),
        claim(id="sooner", metric="time_to_target", better="lower",
              target={"split": "test", "key": "accuracy", "value": 0.5},
              a={"algorithm": "ssp"}, b={"algorithm": "bsp"}),
    ]  # fmt: skip
    for s in range(5):
        write_run(tmp_path, f"ssp{s}", claims, algorithm="ssp", seed=s, status="diverged",
                  final={"accuracy": None}, compute_fraction=0.95 - 0.01 * s,
                  curve=[(0, 0.1), (1.0, 0.6), (2.0, 0.1)])  # fmt: skip
        write_run(tmp_path, f"bsp{s}", claims, algorithm="bsp", seed=s,
                  final={"accuracy": 0.7}, compute_fraction=0.5 + 0.01 * s,
                  curve=[(0, 0.1), (4.0 + 0.1 * s, 0.55)])  # fmt: skip
    v = judge(tmp_path)
    assert v["computes-more"]["verdict"] == "not run"  # was "holds"
    assert "a: seed 0 unusable (diverged, no compute_fraction)" in v["computes-more"]["notes"]
    # ssp "reached" 0.5 at t = 1 before diverging: censored at its end, it cannot win
    assert v["sooner"]["verdict"] == "does not hold"


def test_holm_over_a_papers_claims_and_self_checks_apart():
    assert C.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert C.holm([0.2]) == [0.2]
    assert C.holm([]) == []


def test_training_fails_is_a_claim_of_its_own(tmp_path):
    # "ASP at 64 workers fails to train": ends within ε = 0.05 of chance (0.1), or diverges
    claims = [
        claim(id="asp-fails", kind="fails", value=0.05, a={"algorithm": "asp"}),
        claim(id="bsp-fails", kind="fails", value=0.05, a={"algorithm": "bsp"}),
        claim(id="asp-diverges", kind="diverges", a={"algorithm": "asp"}),
    ]
    for s in range(4):
        status = "diverged" if s == 3 else "completed"
        write_run(tmp_path, f"asp{s}", claims, algorithm="asp", seed=s, status=status,
                  final={"accuracy": 0.11 + 0.01 * s}, final_accuracy=0.11 + 0.01 * s,
                  chance_accuracy=0.1)  # fmt: skip
        write_run(tmp_path, f"bsp{s}", claims, algorithm="bsp", seed=s,
                  final={"accuracy": 0.8}, final_accuracy=0.8, chance_accuracy=0.1)  # fmt: skip
    v = judge(tmp_path)
    assert v["asp-fails"]["verdict"] == "holds"
    assert v["asp-fails"]["ours"] == "4 of 4 runs ended within 0.05 of chance"
    assert v["bsp-fails"]["verdict"] == "does not hold"
    assert v["asp-diverges"]["verdict"] == "inconclusive"  # 1 of 4: training failed, mostly


def test_a_gap_of_exactly_the_margin_is_a_tie_whatever_the_rounding(tmp_path):
    # every seed: a reaches the target one evaluation interval (0.2 s) before b, against a
    # margin of one interval; 3.6 − 3.4 rounds above 0.2 and 3.8 − 3.6 below: both are ties
    claims = [
        claim(id=f"by-more-than-one-interval-{hit}", metric="time_to_target", better="lower",
              margin=0.2, target={"split": "test", "key": "accuracy", "value": 0.5},
              a={"algorithm": f"a{hit}"}, b={"algorithm": f"b{hit}"})
        for hit in (34, 36)
    ]  # fmt: skip
    assert 3.6 - 3.4 > 0.2 > 3.8 - 3.6  # the rounding the verdicts must not depend on
    for hit in (34, 36):
        for s in range(5):
            for side, t in (("a", hit / 10), ("b", hit / 10 + 0.2)):
                write_run(tmp_path, f"{side}{hit}-{s}", claims, algorithm=f"{side}{hit}", seed=s,
                          final={"accuracy": 0.6}, curve=[(0.0, 0.1), (t, 0.6)])  # fmt: skip
    v = judge(tmp_path)
    for hit in (34, 36):  # was: "holds" (p = 0) at 3.4, "does not hold" at 3.6
        assert v[f"by-more-than-one-interval-{hit}"]["verdict"] == "does not hold"
        assert v[f"by-more-than-one-interval-{hit}"]["p"] == 1.0


def test_a_zero_denominator_loses_its_seed_and_says_so(tmp_path):
    # a / b ≤ 0.5 (better lower): clear on seeds 0-2; b is 0 on seeds 3 and 4
    claims = [claim(id="half", kind="ratio", metric="compute_fraction", better="lower",
                    value=0.5, a={"algorithm": "a"}, b={"algorithm": "b"})]  # fmt: skip
    for s in range(5):
        write_run(tmp_path, f"a{s}", claims, algorithm="a", seed=s, compute_fraction=0.2 + 0.01 * s)
        write_run(tmp_path, f"b{s}", claims, algorithm="b", seed=s,
                  compute_fraction=0.0 if s >= 3 else 0.8 + 0.02 * s)  # fmt: skip
    v = judge(tmp_path)["half"]
    assert v["verdict"] == "inconclusive"  # was "holds" on seeds 0-2, with no note
    assert "seed 3 (a / b undefined: b = 0)" in v["notes"]
    assert "seed 4 (a / b undefined: b = 0)" in v["notes"]


def write_pairs(root, claims, diverged_a=(), failed_b=()):
    """SSP computes a clearly larger fraction than BSP on every seed that ran."""
    for s in range(5):
        status = "diverged" if s in diverged_a else "completed"
        write_run(root, f"ssp{s}", claims, algorithm="ssp", seed=s, status=status,
                  compute_fraction=0.9 + 0.01 * s)  # fmt: skip
        status = "failed" if s in failed_b else "completed"
        write_run(root, f"bsp{s}", claims, algorithm="bsp", seed=s, status=status,
                  compute_fraction=0.5 + 0.02 * s)  # fmt: skip


def test_a_diverged_run_is_never_dropped_from_a_claim_on_its_metric(tmp_path):
    # SSP diverged on 2 of 5 seeds: its 3 survivors alone may not make the claim hold
    claims = [
        claim(id="survivors", metric="compute_fraction", a={"algorithm": "ssp"},
              b={"algorithm": "bsp"}),
        claim(id="worst", metric="compute_fraction", failures="worst", a={"algorithm": "ssp"},
              b={"algorithm": "bsp"}),
        claim(id="b-worst", metric="compute_fraction", better="lower", failures="worst",
              a={"algorithm": "bsp"}, b={"algorithm": "ssp"}),
    ]  # fmt: skip
    write_pairs(tmp_path, claims, diverged_a=(1, 3))
    v = judge(tmp_path)
    assert v["survivors"]["verdict"] == "inconclusive"  # was "holds" on the 3 survivors
    assert "seed 1 (a: diverged, no compute_fraction)" in v["survivors"]["notes"]
    assert "survivorship" in v["survivors"]["notes"]
    assert v["worst"]["verdict"] == "inconclusive"  # a's worst: it cannot hold
    # the worst of b's side is the claim's best: it holds on the seeds that ran
    assert v["b-worst"]["verdict"] == "holds"


def test_a_seed_lost_to_a_failure_makes_the_claim_inconclusive_unless_declared(tmp_path):
    # BSP crashed on seed 2 (where it might have won): 4 pairs are not the 5 the sweep ran
    claims = [
        claim(id="lost", metric="compute_fraction", a={"algorithm": "ssp"},
              b={"algorithm": "bsp"}),
        claim(id="declared", metric="compute_fraction", failures="worst",
              a={"algorithm": "ssp"}, b={"algorithm": "bsp"}),
    ]  # fmt: skip
    write_pairs(tmp_path, claims, failed_b=(2,))
    v = judge(tmp_path)
    assert v["lost"]["verdict"] == "inconclusive"  # was "holds" on 4 pairs, with a note
    assert "seed 2 (b: failed)" in v["lost"]["notes"]
    assert v["declared"]["verdict"] == "holds"  # b's failure counted as b's worst


def test_a_late_blow_up_is_a_divergence_whatever_the_status(tmp_path):
    # a reaches the target at t = 1, then its test loss climbs to 12× its first (past
    # budget.diverge_factor = 10) and comes back; its summary says completed
    claims = [
        claim(id="sooner", metric="time_to_target", better="lower",
              target={"split": "test", "key": "accuracy", "value": 0.5},
              a={"algorithm": "a"}, b={"algorithm": "b"}),
        claim(id="a-diverges", kind="diverges", a={"algorithm": "a"}),
    ]  # fmt: skip
    for s in range(5):
        write_run(
            tmp_path,
            f"a{s}",
            claims,
            algorithm="a",
            seed=s,
            final={"accuracy": 0.6},
            curve=[(0.0, 0.1, 2.0), (1.0, 0.6, 0.4), (2.0, 0.1, 24.0), (3.0, 0.6, 0.5)],
        )
        write_run(tmp_path, f"b{s}", claims, algorithm="b", seed=s, final={"accuracy": 0.6},
                  curve=[(0.0, 0.1, 2.0), (3.0 + 0.1 * s, 0.6, 0.5)])  # fmt: skip
    v = judge(tmp_path)
    assert v["sooner"]["verdict"] == "does not hold"  # was "holds": a normal win at t = 1
    assert v["a-diverges"]["verdict"] == "holds"  # was "does not hold": 0 of 5
    assert "test loss 24 at t=2, above budget.diverge_factor=10" in v["a-diverges"]["notes"]


def test_the_report_reads_diverge_factors_default_as_the_runs_do():
    from stalebench.config import BudgetConfig

    assert C.DIVERGE_FACTOR == BudgetConfig().diverge_factor


@pytest.mark.parametrize("key", ["margin", "better"])
def test_margin_and_better_are_required_naming_the_sweep_file_and_claim(key):
    from stalebench.errors import ConfigError
    from stalebench.sweep import SweepConfig

    raw = claim(id="no-default", a={"algorithm": "a"}, b={"algorithm": "b"})
    del raw[key]
    made = C.ClaimConfig(**raw)  # as OmegaConf builds it from a sweep file, then checks it
    with pytest.raises(ConfigError, match=rf"^sweeps/ssp\.yaml: sweep\.claims\[0\]\.{key} "
                       r"\(claim 'no-default'\) must be set"):  # fmt: skip
        SweepConfig(name="ssp", claims=[made])


@pytest.mark.parametrize("written", ["now", "before final_tail"])
def test_a_last_snapshot_dip_does_not_decide_a_claim_on_final_accuracy(tmp_path, written):
    # a plateaus about 0.02 above b over 40 evaluations; on every seed its last snapshot dips
    # 0.05 (one batch's summation order): the last snapshot says a is worse (does not hold),
    # the end of the curve (the mean of the last 4) that it is better
    claims = [claim(id="a-beats-b", a={"algorithm": "a"}, b={"algorithm": "b"})]
    for s in range(5):
        for name, level in (("a", 0.80 + 0.003 * s), ("b", 0.78 + 0.001 * s * s)):
            accs = [level + 0.001 * (i % 3) for i in range(39)]
            accs.append(accs[-1] - (0.05 if name == "a" else 0.0))
            d = tmp_path / f"{name}{s}"
            write_run(tmp_path, f"{name}{s}", claims, algorithm=name, seed=s,
                      curve=[(float(i), acc) for i, acc in enumerate(accs)])  # fmt: skip
            meta = {"algorithm": name, "cluster": "c", "num_workers": 4, "seed": s}
            summary = finalize(d, meta, "completed", None, target_accuracy=0.5)
            assert summary["final_tail"]["evals"] == 4
            if written != "now":  # a summary.json from before: the tail is read off the curve
                del summary["final_tail"]
                (d / "summary.json").write_text(json.dumps(summary))
    # on its last snapshot (summary.json's `final`) a is worse than b on every seed
    runs, _, _ = collect([tmp_path])
    last = {(r["algorithm"], r["seed"]): r["final_accuracy"] for r in runs.to_dict("records")}
    assert all(last["a", s] < last["b", s] for s in range(5))
    v = judge(tmp_path)["a-beats-b"]
    assert v["verdict"] == "holds", v
    # per seed, a − b over the last 4: 0.02 + 0.003 s − 0.001 s² − 0.0125 (a's dip / 4 and
    # the two sides' ripple), 0.0075 on average over seeds 0 to 4
    assert v["estimate"] == pytest.approx(0.0075)

"""The evaluator's holes, each closed: on synthetic run directories built so that the
right verdict is known, every one of these gave a wrong (or silent) verdict under the
previous rule (`m > sd`, end points, per-value rows, failed runs dropped)."""

import json

import pytest
import yaml

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
    events = [
        {"kind": "eval", "t": t, "version": i, "split": "test", "loss": 1.0 - a, "accuracy": a}
        for i, (t, a) in enumerate(curve)
    ]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    body = {"status": status, "error": None, "algorithm": algorithm, "cluster": "c",
            "num_workers": n, "seed": seed, "wall_time_s": 5.0, "final": final,
            **summary}  # fmt: skip
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

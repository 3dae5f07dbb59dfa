"""The evaluator's second round of holes (a reviewer's recomputation of the committed
claims), each closed: every test here gave a wrong or silent verdict record before, on
synthetic runs whose right answer is known by construction."""

import numpy as np
import pandas as pd
import pytest

from stalebench.errors import ConfigError
from stalebench.report import claims as C
from stalebench.report.collect import CURVE_COLUMNS
from stalebench.sweep import SequentialConfig, claim_from_dict
from tests.unit.test_claim_holes import claim, judge, write_run
from tests.unit.test_claims import PUBLISHED, published_rows

SOONER = {"metric": "time_to_target", "better": "lower", "a": {"algorithm": "a"},
          "b": {"algorithm": "b"},
          "target": {"split": "test", "key": "accuracy", "value": 0.5}}  # fmt: skip


def write_blow_up(root, claims):
    """a reaches the target at t = 1, then its test loss climbs to 9× its first (18 against
    2: short of budget.diverge_factor = 10, so the run is not diverged) and comes back; b
    reaches it at t = 3 and more."""
    blow_up = [(0.0, 0.1, 2.0), (1.0, 0.6, 0.4), (2.0, 0.1, 18.0), (3.0, 0.6, 0.5)]
    for s in range(5):
        write_run(root, f"a{s}", claims, algorithm="a", seed=s, final={"accuracy": 0.6},
                  curve=blow_up)  # fmt: skip
        write_run(root, f"b{s}", claims, algorithm="b", seed=s, final={"accuracy": 0.6},
                  curve=[(0.0, 0.1, 2.0), (3.0 + 0.1 * s, 0.6, 0.5)])  # fmt: skip


def test_a_blow_up_after_the_target_is_noted(tmp_path):
    write_blow_up(tmp_path, [claim(id="sooner", **SOONER)])
    v = judge(tmp_path)["sooner"]
    # reached, as the claim is written, but never silently: was "holds" with no note
    assert v["verdict"] == "holds"
    assert v["caveats"] == ["blow-up after the target"]
    assert "a: seed 0 reached the target at t=1, then test loss 18 at t=2, above its first 2" in (
        v["notes"])  # fmt: skip


def test_a_blow_up_after_the_target_unreaches_it_for_a_claim_on_stable_training(tmp_path):
    write_blow_up(tmp_path, [claim(id="stably-sooner", stable=True, **SOONER)])
    v = judge(tmp_path)["stably-sooner"]
    # a never reached it (censored at its end, t = 5): it cannot win
    assert v["verdict"] == "does not hold"
    assert "not reached (the claim is about stable training)" in v["notes"]
    with pytest.raises(ConfigError, match="stable must be false .* unless metric=time_to_target"):
        claim_from_dict(claim(id="x", stable=True, a={"algorithm": "a"}, b={"algorithm": "b"}))


def test_a_target_met_at_t0_is_flagged(tmp_path):
    # both arms start above the target accuracy: a trivial tie at t = 0, not a finding
    claims = [claim(id="sooner", **SOONER)]
    for s in range(3):
        for arm in "ab":
            write_run(tmp_path, f"{arm}{s}", claims, algorithm=arm, seed=s,
                      final={"accuracy": 0.7}, curve=[(0.0, 0.6), (2.0, 0.7)])  # fmt: skip
    v = judge(tmp_path)["sooner"]
    assert v["verdict"] == "does not hold"  # a tie is not a lead
    assert "target met at t = 0" in v["caveats"]  # was: no caveat at all
    assert "b: seed 2 reached the target at t = 0, before any training" in v["notes"]


@pytest.mark.parametrize("tolerance", [1000.0, 2.01])
def test_a_reproduces_tolerance_is_at_most_x2(tolerance):
    # ×1000 accepted ours / theirs = 0.0017 as a reproduction
    with pytest.raises(ConfigError, match=rf"tolerance must be a ratio > 1 and <= 2 .*, got "
                       rf"{tolerance!r}"):  # fmt: skip
        claim_from_dict({**PUBLISHED, "tolerance": tolerance}, "sweep.claims[0]")
    assert claim_from_dict({**PUBLISHED, "tolerance": 2.0}).tolerance == 2.0  # half to twice


def test_deterministic_seeds_are_one_measurement():
    # two cost-only runs whose seed changes nothing: one number, measured twice
    claim_ = claim_from_dict({**PUBLISHED, "min_seeds": 2})
    got = C.judge(claim_, published_rows((0, 140.0), (1, 140.0)), None)
    assert got["n"] == 1 and got["caveats"] == ["one measurement"]  # was n = 2, "2 of 2 runs"
    assert got["ours"].endswith("one measurement (2 runs, identical), within it")
    # a test kind: every side's number bit-identical across the seeds
    ordering = claim_from_dict(claim(id="x", a={"algorithm": "a"}, b={"algorithm": "b"}))
    rows = [{"algorithm": arm, "seed": s, "status": "completed", "final_tail_evals": 1,
             "final_tail_accuracy": acc}
            for s in range(3) for arm, acc in (("a", 0.9), ("b", 0.8))]  # fmt: skip
    got = C.judge(ordering, rows, pd.DataFrame(columns=CURVE_COLUMNS))
    assert got["n"] == 1 and got["caveats"] == ["one measurement"]
    assert "one measurement: the 3 seeds' numbers are identical on every side" in got["notes"]
    assert "(paired t, one measurement: 3 identical seeds)" in C._shown(ordering, got["tests"])
    # seeds that differ stay n seeds
    rows[0]["final_tail_accuracy"] = 0.91
    got = C.judge(ordering, rows, pd.DataFrame(columns=CURVE_COLUMNS))
    assert got["n"] == 3 and got["caveats"] == []


def test_the_welch_fallback_is_said_in_the_verdict(tmp_path):
    # a ran seeds 0-2 and b seeds 10-12: nothing to pair, so Welch's test of the means
    claims = [claim(id="a-beats-b", a={"algorithm": "a"}, b={"algorithm": "b"})]
    for s in range(3):
        write_run(tmp_path, f"a{s}", claims, algorithm="a", seed=s,
                  final={"accuracy": 0.9 + 0.01 * s})  # fmt: skip
        write_run(tmp_path, f"b{s}", claims, algorithm="b", seed=10 + s,
                  final={"accuracy": 0.5 + 0.02 * s})  # fmt: skip
    v = judge(tmp_path)["a-beats-b"]
    assert v["test"] == "Welch t"
    why = "the sides share no seed (a: seeds 0, 1, 2; b: seeds 10, 11, 12)"
    assert v["test_why"] == why
    assert f"Welch's test, not paired: {why}" in v["notes"]  # was: notes ""
    assert why in C.table([v], v["sweep"])["verdict"][0]


def test_each_verdict_names_the_holm_family_of_the_look_that_decided_it():
    # c0 holds at look 1; c1 stays open to look 2, where c0 enters Holm's correction with
    # p 0: c1's verdict there depends on c0's, and its record says so
    rng = np.random.default_rng(2)
    d = np.vstack([3.0 + 0.1 * rng.standard_normal(10), 0.6 + rng.standard_normal(10)])
    family = [claim_from_dict({"id": f"c{i}", "origin": "paper", "metric": "score",
                               "better": "higher", "margin": 0.0, "a": {"algorithm": f"a{i}"},
                               "b": {"algorithm": f"b{i}"}}) for i in range(2)]  # fmt: skip
    rows = [{"sweep": "s", "algorithm": side, "seed": s, "status": "completed", "score": x,
             "sweep.look": 1 if s < 5 else 2, "run_dir": f"{side}/{s}"}
            for i in range(2) for s in range(10)
            for side, x in ((f"a{i}", float(d[i, s])), (f"b{i}", 0.0))]  # fmt: skip
    sweep = {"claims": family, "sequential": SequentialConfig(), "paper": "P", "scale": "small"}
    got = {c.id: C._result("s", sweep, c, j)
           for c, j in C._sequential(sweep, rows, pd.DataFrame(columns=CURVE_COLUMNS))}  # fmt: skip
    assert got["c0"]["look"] == 1 and got["c1"]["look"] == 2, got
    assert got["c0"]["family"] == {"look": 1, "ids": ["c0", "c1"], "carried": {}}
    assert got["c1"]["family"] == {"look": 2, "ids": ["c0", "c1"], "carried": {"c0": 0.0}}
    shown = C.table(list(got.values()), "s")["p (one-sided)"]
    assert "over 2 at look 2, 1 from earlier looks (1 held: p 0; the rest p 1)" in shown[1]
    # a file written before `family` renders as it did
    old = {k: v for k, v in got["c1"].items() if k not in ("family", "caveats", "test_why")}
    assert C.table([old], "s")["p (one-sided)"][0] == f"{old['p']:.2g} (Holm {old['p_holm']:.2g})"


def test_a_runs_end_is_its_run_time_before_its_wall_time():
    # a censored time to target is the run's end: run_time_s where the row has it
    claim_ = claim_from_dict(claim(id="x", **SOONER))
    curve = pd.DataFrame([{"run_dir": "r", "t": t, "split": "test", "version": i, "loss": 1.0,
                           "accuracy": 0.1} for i, t in enumerate((0.0, 4.0))])  # fmt: skip
    row = {"run_dir": "r", "status": "completed", "wall_time_s": 5.0, "run_time_s": 7.0}
    assert C.metric(row, claim_, curve) == C.Value(7.0, censored=True)
    del row["run_time_s"]
    assert C.metric(row, claim_, curve) == C.Value(5.0, censored=True)

"""The presets of the gathering barriers (backup workers, DBS, GBA) at the issue's scale:
4 workers in real processes on CPU and 64 in the simulator, on a heterogeneous cluster
with a fault; the run completes, honours the fault and the profile, its events match the
schema, summary.json is complete and the training loss falls. (The 3-worker suite in
test_conformance.py runs them too, with every other barrier.)"""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import SUMMARY_FIELDS, assert_valid_and_learning, run_job

PRESETS = ["bsp_backup", "dbs", "gba"]
# half the workers 3x slower; worker 1 pauses 0.15 s at 0.1 s
CLUSTER = ["cluster.slow_fraction=0.5", "cluster.slow_factor=3", "cluster.compute_ms=5"]
PAUSE = "cluster.faults=[{worker:1,at_s:0.1,duration_s:0.15}]"
COMMON = ["budget.max_updates=30", "algorithm.update.lr=0.05", "eval.every_updates=10", PAUSE]


def check(summary, events, workers):
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 30 and summary["num_workers"] == workers
    assert_valid_and_learning(events)
    pauses = [e for e in events if e["kind"] == "worker" and e["event"] == "pause"]
    assert [(e["worker"], e["duration_s"]) for e in pauses] == [(1, pytest.approx(0.15, 0.2))]
    # the profile's slow half (15 ms steps against 5; DBS then shrinks their batches): a
    # slow worker has steps past 12 ms, a fast one's typical step (its median, which one
    # step stretched by a loaded machine does not move: a 5 ms step at 13 ms on CI's 2
    # cores) is short
    steps: dict[int, list[float]] = {}
    for e in events:
        if e["kind"] == "update" and e.get("worker", -1) >= 0:
            steps.setdefault(e["worker"], []).append(e["compute_s"])
    half = workers // 2
    assert any(max(s) > 0.012 for w, s in steps.items() if w >= half), steps
    assert all(statistics.median(s) < 0.012 for w, s in steps.items() if w < half), steps


@pytest.mark.timeout(90)
@pytest.mark.parametrize("preset", PRESETS)
def test_sim_runtime_with_64_workers(tmp_path, preset):
    sixty_four = ["runtime=sim", "cluster.num_workers=64", "dataset.sharding=replicated"]
    overrides = [f"algorithm={preset}", *sixty_four, *CLUSTER, *COMMON]
    check(*run_job(tmp_path, overrides)[:2], 64)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", PRESETS)
def test_real_runtime_with_4_workers(tmp_path, preset):
    overrides = [f"algorithm={preset}", "cluster.num_workers=4", *CLUSTER, *COMMON]
    check(*run_job(tmp_path, overrides)[:2], 4)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_backup_run_that_loses_a_worker_fails_by_name(tmp_path):
    overrides = ["algorithm=bsp_backup", "cluster.num_workers=4", "budget.max_updates=100000"]
    overrides += ["cluster.faults=[{worker:2,at_s:0.2,action:die}]", "budget.max_wall_s=10"]
    summary = run_job(tmp_path, overrides).summary
    assert summary["status"] == "failed"
    assert "worker 2" in summary["error"]

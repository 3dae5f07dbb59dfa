"""The slow_compute fault through the engines: every engine that draws the profile's step
times (ps, allreduce, local, gossip) shows the slowed worker's compute_s jump by the factor
at the fault's step and fall back after it, in the simulator and in real processes alike;
DBS sees it and shrinks that worker's minibatch."""

from __future__ import annotations

import pytest

from tests.conftest import run_job

FAULT = "cluster.faults=[{worker:1,at_step:4,action:slow_compute,factor:3,duration_steps:5}]"
COMMON = ["cluster.num_workers=2", "budget.max_updates=12", "cluster.compute_ms=10", FAULT]
SLOW = {4, 5, 6, 7, 8}  # the worker's steps 4 … 4 + 5 − 1

ENGINES = {
    "ps-asp": ["algorithm=asp"],
    "ps-bsp": ["algorithm=bsp"],
    "allreduce": ["algorithm=bsp", "engine=allreduce"],
    "gossip": ["algorithm=sgp"],
}


def compute_by_step(run, worker):
    return {
        e["clock"]: e["compute_s"]
        for e in run.events
        if e["kind"] == "update" and e["worker"] == worker
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ENGINES, ids=str)
def test_the_slowed_workers_compute_jumps_at_the_step_in_the_simulator(tmp_path, engine):
    run = run_job(tmp_path / "run", ["runtime=sim", *COMMON, *ENGINES[engine]])
    slowed, other = compute_by_step(run, 1), compute_by_step(run, 0)
    assert set(slowed) >= set(range(5))  # ASP: worker 1 falls behind, it still got past 4
    for step, seconds in slowed.items():
        assert seconds == pytest.approx(0.03 if step in SLOW else 0.01), (step, seconds)
    assert list(other.values()) == pytest.approx([0.01] * len(other))


@pytest.mark.timeout(60)
def test_the_local_engine_sums_the_slowed_inner_steps_of_a_round(tmp_path):
    # 12 rounds of H = 2 inner steps: steps 4-5 and 6-7 slowed, round 4 holds slowed step 8
    run = run_job(
        tmp_path / "run",
        ["runtime=sim", *COMMON, "algorithm=local_sgd", "algorithm.outer.inner_steps=2"],
    )
    rounds = compute_by_step(run, 1)
    assert [rounds[r] for r in range(12)] == pytest.approx(
        [0.02] * 2 + [0.06] * 2 + [0.04] + [0.02] * 7
    )
    assert list(compute_by_step(run, 0).values()) == pytest.approx([0.02] * 12)


@pytest.mark.timeout(60)
def test_dbs_shrinks_the_slowed_workers_minibatch(tmp_path):
    run = run_job(
        tmp_path / "run",
        [
            "runtime=sim",
            "algorithm=dbs",
            "cluster.num_workers=2",
            "cluster.compute_ms=10",
            "dataset.sharding=replicated",
            "budget.max_updates=40",
            "cluster.faults=[{worker:1,at_step:10,action:slow_compute,factor:3}]",
        ],
    )
    sizes = [
        e["batch_sizes"] for e in run.events if e["kind"] == "barrier" and e["event"] == "rebalance"
    ]
    assert sizes[0] == [32, 32]  # rounds 0-9: equal speeds, equal sizes
    # from the rounds 10-19 on, worker 1 computes a third as fast: about 3/4 and 1/4 of 64
    assert sizes[1:] and all(s == [48, 16] for s in sizes[1:]), sizes


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_processes_pad_the_slowed_steps_as_the_simulator_counts_them(tmp_path):
    fault = "cluster.faults=[{worker:1,at_step:4,action:slow_compute,factor:4,duration_steps:5}]"
    overrides = ["cluster.num_workers=2", "budget.max_updates=12", "cluster.compute_ms=20", fault]
    real = run_job(tmp_path / "real", ["algorithm=bsp", *overrides])
    sim = run_job(tmp_path / "sim", ["runtime=sim", "algorithm=bsp", *overrides])
    measured, counted = compute_by_step(real, 1), compute_by_step(sim, 1)
    assert sorted(measured) == sorted(counted) == list(range(12))
    for step in range(12):  # padded up to the profile's time, real compute a few ms at most
        assert counted[step] == pytest.approx(0.08 if step in SLOW else 0.02)
        assert counted[step] <= measured[step] < counted[step] + 0.04, (step, measured[step])

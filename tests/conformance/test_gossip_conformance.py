"""Every gossip rule and every gossip preset in both runtimes: 64 nodes in the simulator, 4
in real processes on CPU; the run completes, its events match the schema, summary.json is
complete, the training loss falls. A fault is honoured in both runtimes (a pause shows in
the events and the run's length, a death fails the run with its reason), and so is the
cluster profile (a slow node lengthens the simulated run). A new registration or preset is
picked up here without a new test."""

from __future__ import annotations

import pytest

from stalebench.algorithms.gossip import GOSSIP
from stalebench.plugins import load as load_plugins
from tests.conftest import SUMMARY_FIELDS, assert_valid_and_learning, preset_engines, run_job

load_plugins()
PRESETS = [p for p, engine in preset_engines().items() if engine == "gossip"]
CASES = [pytest.param([f"algorithm={p}"], id=f"preset-{p}") for p in PRESETS] + [
    pytest.param(
        ["algorithm=sgp", f"algorithm/gossip={g}", "algorithm.gossip.topology=complete"],
        id=f"gossip-{g}",
    )  # fmt: skip
    for g in GOSSIP.names()
]
COMMON = ["budget.max_updates=20", "eval.every_updates=10"]
SIXTY_FOUR = ["runtime=sim", "cluster.num_workers=64", "dataset.sharding=replicated"]


def check(summary, events, workers):
    assert summary["status"] == "completed", summary["error"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["updates"] == 20 and summary["num_workers"] == workers
    assert summary["gradients"] == 20 * workers  # an update event per node per iteration
    assert_valid_and_learning(events)
    assert len([e for e in events if "consensus" in e]) == 2 * workers  # at both meetings


@pytest.mark.timeout(60)
@pytest.mark.parametrize("overrides", CASES)
def test_sim_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, [*SIXTY_FOUR, *COMMON, *overrides])[:2], 64)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("overrides", [c for c in CASES if c.id.startswith("preset-")])
def test_real_runtime(tmp_path, overrides):
    check(*run_job(tmp_path, ["cluster.num_workers=4", *COMMON, *overrides])[:2], 4)


PAUSE = "cluster.faults=[{worker:1,at_step:3,duration_s:0.5}]"
DEATH = "cluster.faults=[{worker:2,at_step:3,action:die}]"


@pytest.mark.timeout(60)
def test_the_simulator_honours_faults_and_the_profile(tmp_path):
    sim = ["runtime=sim", "algorithm=sgp", "cluster.num_workers=4", *COMMON]
    plain = run_job(tmp_path / "plain", sim)
    paused = run_job(tmp_path / "paused", [*sim, PAUSE])
    dead = run_job(tmp_path / "dead", [*sim, DEATH])
    slow = run_job(tmp_path / "slow", [*sim, "cluster.slowdown=[1,4,1,1]"])
    assert paused.summary["run_time_s"] == pytest.approx(plain.summary["run_time_s"] + 0.5)
    assert [e["worker"] for e in paused.events if e.get("event") == "pause"] == [1]
    assert dead.summary["status"] == "failed" and "worker 2 died" in dead.summary["error"]
    assert slow.summary["run_time_s"] > 3 * plain.summary["run_time_s"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_processes_honour_a_pause_and_a_death(tmp_path):
    real = ["algorithm=sgp", "cluster.num_workers=4", *COMMON, "cluster.compute_ms=20"]
    paused = run_job(tmp_path / "paused", [*real, PAUSE])
    assert paused.summary["status"] == "completed", paused.summary["error"]
    assert paused.summary["run_time_s"] > 20 * 0.02 + 0.5
    assert [e["worker"] for e in paused.events if e.get("event") == "pause"] == [1]
    dead = run_job(tmp_path / "dead", [*real, DEATH, "timeout_s=10"])
    assert dead.summary["status"] == "failed"
    error = dead.summary["error"]  # the peer that lost it, then what the supervisor saw
    assert "worker 2 (rank 2)" in error and "a fault injected by cluster.faults" in error, error


def test_every_rule_and_preset_is_in_the_suite():
    ids = {case.id for case in CASES}
    assert {"preset-sgp", "preset-osgp", "preset-dpsgd"} <= ids
    assert {"gossip-pushsum", "gossip-dpsgd"} <= ids

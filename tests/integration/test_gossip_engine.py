"""engine=gossip against its definitions: on a complete graph SGP is all-reduce SGD (to
float rounding), the nodes' models agree as closely as their graph mixes, a node waits for
its in-peers only (a pause or a slow node delays the run, not every iteration of everyone),
SGP outruns all-reduce under transient stragglers, bad settings are refused by key, and the
simulator and real processes agree on the numbers."""

from __future__ import annotations

import pytest
import torch

from stalebench import experiment
from stalebench.errors import ConfigError
from stalebench.job import Job
from tests.conftest import compose, fast_with, run_job

SIM = ["runtime=sim", "cluster.num_workers=4", "budget.max_updates=12"]
# SGP with plain SGD: the dpsgd preset's local step, the PushSum rule
SGP_SGD = ["algorithm=dpsgd", "algorithm/gossip=pushsum", "algorithm.gossip.topology=exponential"]


def sim(tmp_path, name, *overrides):
    return run_job(tmp_path / name, [*SIM, *overrides])


def updates(run):
    return [e for e in run.events if e["kind"] == "update"]


def consensus(run):
    return [e["consensus"] for e in updates(run) if "consensus" in e]


@pytest.mark.timeout(60)
def test_sgp_on_a_complete_graph_is_allreduce_sgd(tmp_path):
    gossip = sim(tmp_path, "g", *SGP_SGD, "algorithm.gossip.topology=complete")
    bsp = sim(tmp_path, "b", "algorithm=bsp", "engine=allreduce", "algorithm.update.lr=0.1")
    assert gossip.summary["updates"] == bsp.summary["updates"] == 12
    a, b = torch.load(gossip.dir / "model.pt"), torch.load(bsp.dir / "model.pt")
    for key in a:  # x_i − ηg_i averaged by shares of 1/N, against θ − η·mean(g_i)
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    by_step = lambda run: sorted((e["clock"], e["worker"], e["loss"]) for e in updates(run))  # noqa: E731
    assert [r[2] for r in by_step(gossip)] == pytest.approx([r[2] for r in by_step(bsp)], rel=1e-5)
    assert max(consensus(gossip)) < 1e-5  # every node holds the mean


@pytest.mark.timeout(60)
def test_the_nodes_disagree_by_what_one_step_moves_them(tmp_path):
    common = [*SGP_SGD, "cluster.num_workers=16", "dataset.sharding=replicated"]
    common += ["budget.max_updates=30"]
    big = sim(tmp_path, "big", *common, "algorithm.inner.lr=0.1")
    small = sim(tmp_path, "small", *common, "algorithm.inner.lr=0.01")
    theta0 = Job.build(compose(fast_with([*SIM, *common]))).model().state_dict()
    final = torch.load(big.dir / "model.pt")
    moved = sum(float((final[k] - theta0[k]).square().sum()) for k in final) ** 0.5
    assert 0 < max(consensus(big)) < 0.2 * moved  # the nodes agree, after training moved them
    # gossip pulls the models together while each step pushes them apart by O(η)
    mean = lambda run: sum(consensus(run)) / len(consensus(run))  # noqa: E731
    assert mean(small) < 0.3 * mean(big)


@pytest.mark.timeout(60)
def test_a_paused_node_delays_its_out_peers_not_every_node(tmp_path):
    # one meeting, at the end: no collective in between makes everyone wait
    base = ["algorithm=sgp", "cluster.compute_ms=10", "engine.sync_every=12"]
    plain = sim(tmp_path, "plain", *base)
    paused = sim(tmp_path, "paused", *base, "cluster.faults=[{worker:1,at_s:0.02,duration_s:1.0}]")
    assert plain.summary["run_time_s"] == pytest.approx(0.12)
    assert paused.summary["run_time_s"] == pytest.approx(1.12)
    pauses = [e for e in paused.events if e["kind"] == "worker" and e["event"] == "pause"]
    assert [(p["worker"], p["duration_s"]) for p in pauses] == [(1, pytest.approx(1.0))]
    # the pause strikes node 1's iteration 2 (it starts at 0.02 s); there the graph's hop is
    # 2^(2 mod 2) = 1, so node 2 waits for node 1's message and node 0 (in-peer 3) does not
    third = {e["worker"]: e for e in updates(paused) if e["clock"] == 2}
    assert third[2]["wait_s"] == pytest.approx(1.0)
    assert third[0]["wait_s"] == 0.0 and third[0]["t"] == pytest.approx(0.03)


@pytest.mark.timeout(60)
def test_a_dead_node_fails_the_simulated_run_with_its_reason(tmp_path):
    run = sim(tmp_path, "dead", "algorithm=sgp", "cluster.faults=[{worker:2,at_s:0.02,action:die}]")
    assert run.summary["status"] == "failed"
    assert "worker 2 died" in run.summary["error"]


@pytest.mark.timeout(60)
def test_a_slow_node_slows_the_run(tmp_path):
    plain = sim(tmp_path, "plain", "algorithm=osgp")
    slow = sim(tmp_path, "slow", "algorithm=osgp", "cluster.slowdown=[1,1,1,3]")
    assert slow.summary["run_time_s"] > 2 * plain.summary["run_time_s"]
    rates = {e["worker"]: e["compute_s"] for e in updates(slow)}
    assert rates == pytest.approx({0: 0.005, 1: 0.005, 2: 0.005, 3: 0.015})


@pytest.mark.timeout(90)
def test_sgp_outruns_allreduce_under_transient_stragglers_and_osgp_outruns_sgp(tmp_path):
    common = ["cluster=stragglers", "cluster.num_workers=16", "budget.max_updates=80"]
    common += ["dataset.sharding=replicated"]
    sgp = sim(tmp_path, "sgp", "algorithm=sgp", *common)
    osgp = sim(tmp_path, "osgp", "algorithm=osgp", *common)
    bsp = sim(tmp_path, "bsp", "algorithm=bsp", "engine=allreduce", *common)
    for run in (sgp, osgp, bsp):
        assert run.summary["status"] == "completed" and run.summary["updates"] == 80
    # all-reduce waits for the slowest of 16 every step; a node, for its in-peer; with τ = 1
    # a node may run an iteration ahead of its in-peer
    wall = [run.summary["run_time_s"] for run in (osgp, sgp, bsp)]
    assert wall[0] < wall[1] < 0.85 * wall[2], wall


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["algorithm=sgp", "engine.sync_every=0"], "engine.sync_every"),
        (["algorithm=dpsgd", "algorithm.gossip.topology=exponential"], "topology=exponential"),
        (["algorithm=sgp", "cluster.num_workers=1"], "cluster.num_workers=1"),
        (["algorithm=sgp", "algorithm.inner.reset=true"], "algorithm.inner.reset"),
        (["algorithm=sgp", "cluster.spares=1"], "cluster.spares"),
        (["algorithm=bsp", "engine=gossip"], "algorithm.gossip"),
    ],
)
def test_bad_input_is_refused_before_any_process_starts(overrides, key):
    with pytest.raises(ConfigError, match=key):
        experiment.prepare(compose(fast_with(["budget.max_updates=10", *overrides])))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("preset", ["sgp", "osgp"])
def test_the_simulator_and_real_processes_agree(tmp_path, preset):
    common = [f"algorithm={preset}", "cluster.num_workers=4", "budget.max_updates=20"]
    # 20 ms steps: the profile, not a busy machine's compute, sets a real step's length
    common += ["cluster.compute_ms=20", "cluster.slowdown=[1,1,1,2]", "eval.every_updates=10"]
    real = run_job(tmp_path / "real", common)
    simulated = run_job(tmp_path / "sim", ["runtime=sim", *common])
    for run in (real, simulated):
        assert run.summary["status"] == "completed", run.summary["error"]
        assert run.summary["updates"] == 20
    assert real.summary["bytes_sent"] == simulated.summary["bytes_sent"] > 0
    # the same messages added in the same order: the same losses, to the gradients' rounding
    losses = lambda run: sorted((e["clock"], e["worker"], e["loss"]) for e in updates(run))  # noqa: E731
    assert [r[2] for r in losses(real)] == pytest.approx(
        [r[2] for r in losses(simulated)], rel=1e-4
    )
    rate = lambda run: [  # noqa: E731
        sum(e["compute_s"] for e in updates(run) if e["worker"] == w) / 20 for w in range(4)
    ]
    assert rate(simulated) == pytest.approx([0.020, 0.020, 0.020, 0.040])
    assert rate(real) == pytest.approx(rate(simulated), rel=0.3)

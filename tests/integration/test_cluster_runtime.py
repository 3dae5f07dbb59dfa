"""Cluster profiles at work in both runtimes: the same draws, network delays, faults,
per-worker BatchNorm in the simulator, determinism, and sim-vs-real fidelity."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import run_job


def ups(run):
    return [e for e in run.events if e["kind"] == "update"]


@pytest.mark.timeout(60)
def test_sim_events_are_byte_identical_for_a_seed(tmp_path):
    overrides = [
        "runtime=sim",
        "cluster=stragglers",
        "cluster.compute=gamma",
        "cluster.gamma_shape=4",
        "cluster.compute_ms=5",
        "algorithm=psp",
        "budget.max_updates=150",
        "cluster.pull_latency_ms=1",
    ]
    a = run_job(tmp_path / "a", overrides)
    b = run_job(tmp_path / "b", overrides)
    c = run_job(tmp_path / "c", [*overrides, "seed=1"])
    assert (a.dir / "events.jsonl").read_bytes() == (b.dir / "events.jsonl").read_bytes()
    assert (a.dir / "events.jsonl").read_bytes() != (c.dir / "events.jsonl").read_bytes()


@pytest.mark.timeout(60)
def test_sim_compute_times_are_the_profiles_draws(tmp_path):
    import numpy as np

    from tests.conftest import FAST, compose

    overrides = [
        "runtime=sim",
        "cluster.compute=gamma",
        "cluster.gamma_shape=3",
        "cluster.compute_ms=10",
        "cluster.slowdown=[1,2,1,1]",
        "budget.max_updates=60",
    ]
    run = run_job(tmp_path, overrides)
    seed = compose(FAST + overrides).seed
    for w, slowdown in enumerate([1, 2, 1, 1]):
        mine = [e["compute_s"] for e in ups(run) if e["worker"] == w]
        # the profile's definition, computed here: worker w draws from its own stream,
        # seeded by (seed, w), Gamma(k, compute_ms / k) ms times its slowdown
        rng = np.random.default_rng([seed, w, 0x5B])
        drawn = [rng.gamma(3, 10 / 3) * slowdown / 1000 for _ in mine]
        assert mine == pytest.approx(drawn, rel=1e-9)


@pytest.mark.timeout(60)
def test_sim_network_delays_appear_as_comm_time(tmp_path):
    run = run_job(
        tmp_path, ["runtime=sim", "algorithm=asp", "cluster=slow_network", "budget.max_updates=40"]
    )
    import torch

    later = [e for e in ups(run) if e["clock"] > 0]
    # a message is 8 float32 header slots and θ; θ's size read from the saved model
    d = sum(t.numel() for t in torch.load(tmp_path / "model.pt").values())
    nbytes = 4 * (8 + d)
    # each step's round trip: 5 ms latency plus the message over 100 Mbit/s, each way
    expected = 2 * (0.005 + nbytes * 8 / 1e8)
    assert [e["comm_s"] for e in later] == pytest.approx([expected] * len(later))


@pytest.mark.timeout(60)
def test_sim_fault_pause_and_die(tmp_path):
    paused = run_job(
        tmp_path / "p",
        [
            "runtime=sim",
            "algorithm=asp",
            "budget.max_updates=60",
            "cluster.faults=[{worker:1,at_s:0.05,duration_s:0.2}]",
        ],
    )
    assert paused.summary["status"] == "completed"
    (pause,) = [e for e in paused.events if e["kind"] == "worker" and e["event"] == "pause"]
    assert pause["worker"] == 1 and pause["duration_s"] == 0.2
    died = run_job(  # a barrier that waits for every worker (ASP goes on: test_worker_loss)
        tmp_path / "d",
        [
            "runtime=sim",
            "algorithm=ssp",
            "budget.max_updates=60",
            "cluster.faults=[{worker:2,at_s:0.05,action:die}]",
        ],
    )
    assert died.summary["status"] == "failed"
    assert "worker 2 died" in died.summary["error"] and "cluster.faults" in died.summary["error"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_fault_die_fails_the_run_and_names_the_fault(tmp_path):
    run = run_job(  # a barrier that waits for every worker (ASP goes on: test_worker_loss)
        tmp_path,
        [
            "algorithm=ssp",
            "budget.max_updates=400",
            "timeout_s=10",
            "cluster.faults=[{worker:1,at_s:0.3,action:die}]",
        ],
    )
    assert run.summary["status"] == "failed"
    assert "worker 1 (rank 2)" in run.summary["error"]
    assert "fault injected by cluster.faults" in run.summary["error"]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_fault_pause_and_network_delay(tmp_path):
    run = run_job(
        tmp_path,
        [
            "algorithm=asp",
            "budget.max_updates=80",
            "cluster.num_workers=2",
            "cluster.push_latency_ms=4",
            "cluster.pull_latency_ms=4",
            "cluster.faults=[{worker:0,at_s:0.1,duration_s:0.3}]",
        ],
    )
    assert run.summary["status"] == "completed"
    assert [e["worker"] for e in run.events if e["kind"] == "worker" and e["event"] == "pause"] == [
        0
    ]
    later = [e for e in ups(run) if e["clock"] > 0]
    assert statistics.median(e["comm_s"] for e in later) >= 0.008  # both latencies, each step


SLOW = "cluster.faults=[{worker:1,at_step:3,action:slow,delay_ms:40}]"


@pytest.mark.timeout(60)
def test_sim_slow_sends_lengthen_that_workers_round_trips_from_its_step(tmp_path):
    base = ["runtime=sim", "algorithm=asp", "cluster=slow_network", "budget.max_updates=60"]
    plain, slow = (run_job(tmp_path / k, [*base, *f]) for k, f in [("p", []), ("s", [SLOW])])
    comm = {(e["worker"], e["clock"]): e["comm_s"] for e in ups(plain)}
    slowed = {(e["worker"], e["clock"]): e["comm_s"] for e in ups(slow)}
    # the push of its step 3 is the first slowed: the round trip read at its step 4
    for (w, clock), c in slowed.items():
        if clock > 0:
            extra = 0.04 if (w, clock >= 4) == (1, True) else 0.0
            assert c == pytest.approx(comm[(0, 1)] + extra), (w, clock)
    assert max(k[1] for k in slowed if k[0] == 1) < max(k[1] for k in comm if k[0] == 1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "args,messages",
    [
        (["engine=allreduce", "algorithm=bsp"], 6),  # a ring all-reduce: 2(N − 1) sends
        # one all-reduce a round on the wire: the payload (the statistics ride free)
        (["algorithm=diloco", "algorithm.outer.inner_steps=1"], 6),
    ],
    ids=["allreduce", "local"],
)
def test_sim_a_slow_sender_slows_every_ring_step_of_the_round(tmp_path, args, messages):
    """From worker 1's step 3 every round ends 2(N − 1) × 40 ms later per all-reduce: each
    of the ring's steps waits for its chunk."""
    base = ["runtime=sim", *args, "cluster=homogeneous", "budget.max_updates=8"]
    plain, slow = (run_job(tmp_path / k, [*base, *f]) for k, f in [("p", []), ("s", [SLOW])])
    ends = [[e["t"] for e in ups(r) if e["worker"] == 0] for r in (plain, slow)]
    extra = [b - a for a, b in zip(*ends, strict=True)]
    assert extra == pytest.approx([0, 0, 0] + [messages * 0.04 * k for k in range(1, 6)])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_real_slow_sends_lengthen_that_workers_round_trips(tmp_path):
    slow = "cluster.faults=[{worker:1,at_step:3,action:slow,delay_ms:150}]"
    args = ["algorithm=asp", "budget.max_updates=100000", "budget.max_wall_s=1.5", slow]
    run = run_job(tmp_path, args)
    assert run.summary["status"] == "completed"
    comm = {
        w: [e["comm_s"] for e in ups(run) if e["worker"] == w and e["clock"] >= 4] for w in (0, 1)
    }
    assert comm[1] and min(comm[1]) >= 0.15  # each of its pushes waits 150 ms more
    assert statistics.median(comm[0]) < 0.05


@pytest.mark.timeout(60)
def test_sim_keeps_batch_norm_statistics_per_worker(tmp_path):
    import torch

    from stalebench.engines.common import Net
    from stalebench.job import Job
    from tests.conftest import compose, fast_with

    cfg = compose(
        fast_with(["model=cnn", "model.batch_norm=true", "dataset=mnist1d", "budget.max_updates=1"])
    )
    job = Job.build(cfg)
    net = Net(job, torch.device("cpu"))  # the simulator's one model for every worker
    init = [b.clone() for b in net.buffers]
    a, b = [t.clone() for t in init], [t.clone() for t in init]  # two workers' statistics
    x, y, out = job.splits.x_train, job.splits.y_train, torch.empty(net.flat.numel())
    theta = net.flat.clone()
    net.gradient_at(theta, a, (x[:32] * 3 + 1, y[:32]), out)
    assert all(torch.equal(mine, first) for mine, first in zip(b, init, strict=True))
    net.gradient_at(theta, b, (x[32:64], y[32:64]), out)
    means = (
        [m for m in a if m.dtype.is_floating_point][0],
        [m for m in b if m.dtype.is_floating_point][0],
    )
    assert not torch.allclose(*means)  # each worker's statistics come from its own data
    run = run_job(
        tmp_path,
        [
            "runtime=sim",
            "model=cnn",
            "model.batch_norm=true",
            "dataset=mnist1d",
            "budget.max_updates=200",
            "algorithm=asp",
        ],
    )
    tests = [e for e in run.events if e["kind"] == "eval" and e["split"] == "test"]
    assert tests[-1]["accuracy"] > tests[0]["accuracy"] + 0.15


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sim_and_real_agree_on_the_same_profile(tmp_path):
    """Fidelity: 4 workers, heterogeneous, ASP. Lag distribution and per-worker step rates
    from the simulator match a real run within the stated tolerance (real runs pay a few ms
    of transfer and scheduling per step that the profile does not model)."""
    common = [
        "algorithm=asp",
        "cluster.num_workers=4",
        "cluster.compute_ms=40",
        "cluster.slowdown=[1,1,2,3]",
        "budget.max_updates=0",
        "budget.max_wall_s=6",
    ]
    real = run_job(tmp_path / "real", common)
    sim = run_job(tmp_path / "sim", ["runtime=sim", *common])
    for run in (real, sim):
        assert run.summary["status"] == "completed"
    rate = {
        name: [
            sum(e["worker"] == w for e in ups(run)) / run.summary["run_time_s"] for w in range(4)
        ]
        for name, run in (("real", real), ("sim", sim))
    }
    # Real steps pay what the profile does not model (transfer, scheduling): a real worker
    # is never faster than its simulated twin, and on a loaded 2-core machine up to ~10 %
    # slower (7 % measured with one core busy). The margins below hold under that load;
    # the fidelity figure itself is a benchmark (benchmarks/allreduce_fidelity.py).
    for w in range(4):
        assert 0.75 <= rate["real"][w] / rate["sim"][w] <= 1.05, rate
    # the slower workers' share sets the lag: the same to within a third of a step on
    # average; the median may sit on a boundary between two integers, so ±1
    assert real.summary["lag"]["mean"] == pytest.approx(sim.summary["lag"]["mean"], abs=0.35)
    assert abs(real.summary["lag"]["p50"] - sim.summary["lag"]["p50"]) <= 1

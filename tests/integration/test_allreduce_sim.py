"""The allreduce engine on the sim runtime: a round costs the slowest compute plus one ring
all-reduce (Network.allreduce_s), the numbers are PS-BSP's, the events are deterministic
and shaped like the real engine's; and a real run pays at least the modelled time."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FAST, compose, fast_with, run_job

# three workers, one twice as slow, behind an asymmetric network
NET = [
    "algorithm=bsp",
    "cluster.num_workers=3",
    "cluster.slowdown=[1,1,2]",
    "cluster.push_latency_ms=2",
    "cluster.pull_latency_ms=3",
    "cluster.push_bandwidth_gbps=0.1",
    "cluster.pull_bandwidth_gbps=0.05",
    "budget.max_updates=20",
]
SIM_AR = ["runtime=sim", "engine=allreduce", *NET]


def ups(run):
    return [e for e in run.events if e["kind"] == "update"]


def modelled(overrides):
    """(seconds of one all-reduce of the engine's message, bytes all ranks send in one, the
    per-worker step times) for a config, computed here from its numbers, not by the profile:
    a ring of N ranks takes 2(N − 1) steps, each the slower direction's latency plus a chunk
    of nbytes/N at its bandwidth; a constant step is compute_ms times the worker's slowdown."""
    from stalebench.job import Job

    cfg = compose(fast_with(overrides))
    c, n = cfg.cluster, cfg.cluster.num_workers
    d = sum(p.numel() for p in Job.build(cfg).model().parameters())
    nbytes = 4 * (d + 3 * n + 1)  # gradient, 3 slots per rank, the stop flag

    def one_way(latency_ms, gbps):
        return latency_ms / 1e3 + (nbytes / n * 8 / (gbps * 1e9) if gbps else 0.0)

    ring_step = max(
        one_way(c.push_latency_ms, c.push_bandwidth_gbps),
        one_way(c.pull_latency_ms, c.pull_bandwidth_gbps),
    )
    slowdown = c.slowdown or [1] * n
    steps = [c.compute_ms * m / 1e3 for m in slowdown]
    return 2 * (n - 1) * ring_step, 2 * (n - 1) * nbytes, steps


@pytest.mark.timeout(60)
def test_a_sim_round_is_the_slowest_compute_plus_one_allreduce(tmp_path):
    run = run_job(tmp_path, SIM_AR)
    allreduce_s, volume, steps = modelled(SIM_AR)
    round_s = max(steps) + allreduce_s
    assert steps == [0.005, 0.005, 0.01]
    assert allreduce_s > 0.012  # 4 steps of 3 ms latency and a chunk at 50 Mbit/s
    s = run.summary
    assert (s["status"], s["engine"], s["runtime"], s["updates"]) == (
        "completed",
        "allreduce",
        "sim",
        20,
    )
    events = ups(run)
    assert len(events) == 20 * 3
    ends = sorted({e["t"] for e in events})
    assert len(ends) == 20  # one time per round: every worker's update at its end
    for k, t in enumerate(ends, start=1):  # events round t to the microsecond
        assert t == pytest.approx(k * round_s, abs=1e-6)
    assert s["run_time_s"] == pytest.approx(20 * round_s, abs=1e-6)
    assert s["throughput_updates_per_s"] == pytest.approx(1 / round_s, rel=1e-6)
    for e in events:  # the real engine's fields: this round's wait, the all-reduce as comm
        # the statistics travel in the round's float32 message, in both runtimes: exact to
        # float32 (the simulator used to report them unrounded, which no real run can)
        f32 = [float(torch.tensor(step)) for step in steps]
        assert e["compute_s"] == f32[e["worker"]]
        assert e["wait_s"] == pytest.approx(max(f32) - f32[e["worker"]], abs=1e-15)
        # rank 0's all-reduce time less the wait, the wait from the float32 statistics
        assert e["comm_s"] == pytest.approx(allreduce_s, rel=1e-7)
        assert (e["lag"], e["clock_gap"], e["version"]) == (0, 0, e["clock"] + 1)
    assert s["bytes_sent"] == 20 * volume


@pytest.mark.timeout(60)
def test_sim_allreduce_computes_what_sim_ps_bsp_computes(tmp_path):
    common = [*NET, "runtime=sim", "algorithm/update=momentum"]
    ps = run_job(tmp_path / "ps", common)
    ar = run_job(tmp_path / "ar", [*common, "engine=allreduce"])
    key = ("worker", "clock", "version", "lag", "loss")
    seen = [[tuple(e[k] for k in key) for e in ups(run)] for run in (ps, ar)]
    assert seen[0] == seen[1]
    pa, pb = torch.load(ps.dir / "model.pt"), torch.load(ar.dir / "model.pt")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)  # the same state machine: exact
    # ... only the clock differs: a ring of 4 latency-bound steps against a push and a pull
    assert ar.summary["run_time_s"] != ps.summary["run_time_s"]


@pytest.mark.timeout(60)
def test_sim_allreduce_events_are_byte_identical_for_a_seed(tmp_path):
    overrides = [*SIM_AR, "cluster.compute=gamma", "cluster.gamma_shape=4"]
    a = run_job(tmp_path / "a", overrides)
    b = run_job(tmp_path / "b", overrides)
    c = run_job(tmp_path / "c", [*overrides, "seed=1"])
    assert (a.dir / "events.jsonl").read_bytes() == (b.dir / "events.jsonl").read_bytes()
    assert (a.dir / "events.jsonl").read_bytes() != (c.dir / "events.jsonl").read_bytes()
    assert len({e["wait_s"] for e in ups(a)}) > 3  # gamma draws: waits vary round to round


@pytest.mark.timeout(60)
def test_sim_allreduce_refuses_an_asynchronous_barrier(tmp_path):
    from stalebench.errors import ConfigError

    with pytest.raises(ConfigError, match="engine=allreduce is synchronous"):
        run_job(tmp_path, [*SIM_AR, "algorithm=asp"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_allreduce_round_takes_at_least_the_modelled_time(tmp_path):
    """N = 2 behind 20 ms of latency (the network dominates 5 ms of compute): every measured
    round lasts at least compute + allreduce_s (a lower bound: real runs add gloo and Python),
    and the parameters are the simulator's up to the all-reduce's summation."""
    overrides = [
        *FAST,
        "algorithm=bsp",
        "engine=allreduce",
        "cluster.num_workers=2",
        "cluster.push_latency_ms=20",
        "cluster.pull_latency_ms=20",
        "budget.max_updates=15",
    ]
    real = run_job(tmp_path / "real", overrides)
    allreduce_s, volume, steps = modelled(overrides)
    assert allreduce_s == pytest.approx(0.040)  # 2 steps of 20 ms
    assert real.summary["status"] == "completed" and real.summary["updates"] == 15
    ends = sorted({e["t"] for e in ups(real)})
    rounds = [b - a for a, b in zip([0.0, *ends], ends, strict=False)]
    modelled_round = max(steps) + allreduce_s
    assert min(rounds) >= modelled_round - 1e-6, (rounds, modelled_round)  # µs rounding
    # comm_s now includes the modelled network (it was measured around the all-reduce only)
    assert sorted(e["comm_s"] for e in ups(real))[len(ups(real)) // 2] >= 0.9 * allreduce_s
    assert real.summary["bytes_sent"] == 15 * volume
    sim = run_job(tmp_path / "sim", ["runtime=sim", *overrides])
    assert sim.summary["bytes_sent"] == real.summary["bytes_sent"]
    assert [e["clock"] for e in ups(sim)] == [e["clock"] for e in ups(real)]
    pa, pb = torch.load(real.dir / "model.pt"), torch.load(sim.dir / "model.pt")
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(60)
def test_sim_buckets_change_the_clock_not_the_numbers(tmp_path):
    """engine.bucket_mb in the simulator: the same updates, step times (one draw a round
    from each worker's stream) and parameters as one message; one bucket holding everything
    takes the one message's rounds; buckets of some fifty floats behind a latency-bound link
    take longer (each pays the ring's latency)."""
    drawn = [*SIM_AR, "cluster.compute=gamma"]
    one = run_job(tmp_path / "one", drawn)
    whole = run_job(tmp_path / "whole", [*drawn, "engine.bucket_mb=1"])
    small = run_job(tmp_path / "small", [*drawn, "engine.bucket_mb=0.0002"])
    key = ("worker", "clock", "version", "lag", "loss", "compute_s")
    seen = [[tuple(e[k] for k in key) for e in ups(run)] for run in (one, whole, small)]
    assert seen[0] == seen[1] == seen[2]
    pa, pb = torch.load(one.dir / "model.pt"), torch.load(small.dir / "model.pt")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    wall = [run.summary["run_time_s"] for run in (one, whole, small)]
    assert wall[1] == pytest.approx(wall[0], rel=1e-9)
    assert wall[2] > wall[0] * 1.2
    assert small.summary["bytes_sent"] == one.summary["bytes_sent"]


@pytest.mark.timeout(60)
def test_sim_p3_changes_the_clock_not_the_numbers_and_overlaps_the_next_forward(tmp_path):
    """engine.schedule=p3 in the simulator: the numbers of the one-message round (an
    element-wise rule, applied whole at the round's end: the θ P3's forward reaches layer
    by layer); its slices, sent by priority while the next forward waits only for the
    layers it reaches, end its rounds sooner than fifo's buckets of the same size, which
    the update waits for whole."""
    # six hidden layers of 256 (P3 gains where there are layers to overlap), 3 workers of
    # gamma step times of 20 ms on links of 1 Gbit/s and 50 µs (a round's ring ~1.7 MB)
    drawn = [
        "runtime=sim", "engine=allreduce", "algorithm=bsp", "cluster.num_workers=3",
        "model.hidden=[256,256,256,256,256,256]", "cluster.compute=gamma",
        "cluster.compute_ms=20", "cluster.push_latency_ms=0.05", "cluster.pull_latency_ms=0.05",
        "cluster.push_bandwidth_gbps=1", "cluster.pull_bandwidth_gbps=1", "budget.max_updates=20",
    ]  # fmt: skip
    one = run_job(tmp_path / "one", drawn)
    fifo = run_job(tmp_path / "fifo", [*drawn, "engine.bucket_mb=0.1"])
    p3 = run_job(tmp_path / "p3", [*drawn, "engine.bucket_mb=0.1", "engine.schedule=p3"])
    key = ("worker", "clock", "version", "lag", "loss", "compute_s")
    seen = [[tuple(e[k] for k in key) for e in ups(run)] for run in (one, fifo, p3)]
    assert seen[0] == seen[1] == seen[2]
    pa, pb = torch.load(one.dir / "model.pt"), torch.load(p3.dir / "model.pt")
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert p3.summary["bytes_sent"] == fifo.summary["bytes_sent"] == one.summary["bytes_sent"]
    wall = [run.summary["run_time_s"] for run in (p3, fifo, one)]
    assert wall == sorted(wall) and len(set(wall)) == 3, wall  # p3 < fifo < one message

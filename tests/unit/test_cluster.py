"""Cluster profiles: each compute-time model, speed multipliers, stragglers, the network
model and fault validation, and the per-worker seeded streams."""

import math
import re

import numpy as np
import pytest

from stalebench.cluster import ClusterConfig, FaultConfig, Profile
from stalebench.errors import ConfigError
from stalebench.runtime.faults import Faults, WorkerDied
from stalebench.runtime.network import Network


def profile(seed=0, **kw):
    return Profile(ClusterConfig(name="profile", **kw), seed)


def draws(p, worker, k):
    return np.array([p.step_s(worker) for _ in range(k)])


def test_constant_steps_scale_with_each_workers_slowdown():
    p = profile(num_workers=4, compute_ms=20, slow_fraction=0.5, slow_factor=2, slow_factor_max=3)
    assert p.slowdown == [1.0, 1.0, 2.0, 3.0]
    assert [p.step_s(w) for w in range(4)] == [0.02, 0.02, 0.04, 0.06]
    assert profile(num_workers=2, compute_ms=10, slowdown=[1, 4]).step_s(1) == 0.04


def test_gamma_has_the_configured_mean_and_variation():
    p = profile(num_workers=1, compute="gamma", compute_ms=32, gamma_shape=100)
    x = draws(p, 0, 20000)
    assert x.mean() == pytest.approx(0.032, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(0.1, rel=0.05)  # CV = 1/√k
    owl = draws(profile(num_workers=1, compute="gamma", compute_ms=1000, gamma_shape=1), 0, 20000)
    assert owl.mean() == pytest.approx(1.0, rel=0.03) and owl.std() == pytest.approx(1.0, rel=0.05)


def test_lognormal_keeps_the_mean():
    x = draws(
        profile(num_workers=1, compute="lognormal", compute_ms=10, lognormal_sigma=0.8), 0, 40000
    )
    assert x.mean() == pytest.approx(0.010, rel=0.03)


def test_trace_is_replayed_per_worker_and_cycled(tmp_path):
    trace = tmp_path / "steps.csv"
    trace.write_text("worker,ms\n0,10\n1,30\n0,20\n")
    p = profile(num_workers=3, compute="trace", trace_file=str(trace), slowdown=[1, 1, 2])
    assert list(draws(p, 0, 3)) == [0.010, 0.020, 0.010]
    assert list(draws(p, 1, 2)) == [0.030, 0.030]
    assert list(draws(p, 2, 2)) == [0.020, 0.040]  # worker 2 replays worker 0's series, 2x slow
    missing = str(tmp_path / "none.csv")
    with pytest.raises(ConfigError, match=re.escape(f"cluster.trace_file: {missing!r} does not")):
        profile(compute="trace", trace_file=missing)
    (tmp_path / "bad.csv").write_text("w,t\n0,1\n")
    with pytest.raises(ConfigError, match="columns worker,ms"):
        profile(compute="trace", trace_file=str(tmp_path / "bad.csv"))


def test_a_trace_is_replayed_in_row_order_and_may_hold_steps_under_1_ms(tmp_path):
    # three rows for one worker (two would read the same forwards and backwards); 0 ms and
    # 0.5 ms are step times like any other, only negative ones are refused
    trace = tmp_path / "steps.csv"
    trace.write_text("worker,ms\n0,0.5\n0,0\n0,30\n")
    p = profile(num_workers=1, compute="trace", trace_file=str(trace), slowdown=[1])
    assert list(draws(p, 0, 4)) == [0.0005, 0.0, 0.030, 0.0005]


def test_transient_stragglers_hit_at_the_configured_rate():
    x = draws(
        profile(num_workers=1, compute_ms=10, straggler_prob=0.1, straggler_factor=5), 0, 20000
    )
    slow = np.isclose(x, 0.05)
    assert set(np.round(x, 6)) == {0.01, 0.05}
    assert slow.mean() == pytest.approx(0.1, abs=0.01)


def test_each_worker_has_its_own_seeded_stream():
    cfg = dict(num_workers=3, compute="gamma", compute_ms=10, gamma_shape=2, straggler_prob=0.2)
    a, b = profile(seed=5, **cfg), profile(seed=5, **cfg)
    # interleaving the workers' draws differently changes nothing for any worker
    seq_a = {w: list(draws(a, w, 50)) for w in (0, 1, 2)}
    seq_b = {w: list(draws(b, w, 50)) for w in (2, 0, 1)}
    assert seq_a == seq_b
    assert seq_a[0] != seq_a[1]
    assert list(draws(profile(seed=6, **cfg), 0, 50)) != seq_a[0]


def test_network_delay_is_latency_plus_size_over_bandwidth():
    p = Network(ClusterConfig(push_latency_ms=5, pull_latency_ms=1, push_bandwidth_gbps=0.1))
    assert p.push_s(1_000_000) == pytest.approx(0.005 + 8e6 / 1e8)
    assert p.pull_s(1_000_000) == pytest.approx(0.001)  # unlimited bandwidth
    assert Network(ClusterConfig()).push_s(10**9) == 0.0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(compute="uniform"), r"cluster\.compute must be one of"),
        (dict(compute="gamma", compute_ms=0), r"cluster\.compute_ms must be > 0"),
        (dict(push_latency_ms=-1), r"cluster\.push_latency_ms must be >= 0"),
        (dict(straggler_prob=1.5), r"cluster\.straggler_prob must be in \[0, 1\]"),
        (dict(slow_factor=2, slow_factor_max=1.5), r"cluster\.slow_factor_max"),
        (dict(faults=[FaultConfig(worker=9)]), r"cluster\.faults\[0\]\.worker"),
        (dict(faults=[FaultConfig(action="explode")]), r"cluster\.faults\[0\]\.action"),
        (dict(num_workers=0), r"cluster\.num_workers must be >= 1, got 0"),
    ],
)
def test_bad_profiles_name_the_key(kw, match):
    with pytest.raises(ConfigError, match=match):
        ClusterConfig(name="profile", **kw)


def test_faults_come_in_time_order_per_worker():
    p = profile(
        num_workers=2,
        faults=[
            FaultConfig(1, 5.0, "die"),
            FaultConfig(1, 2.0, "pause", 1),
            FaultConfig(0, 1.0, "pause", 3),
        ],
    )
    assert [(f.at_s, f.action) for f in p.faults(1)] == [(2.0, "pause"), (5.0, "die")]
    assert math.isclose(p.faults(0)[0].duration_s, 3)


def test_a_seeds_step_times_stay_the_same_across_versions():
    """Simulated histories are a function of config and seed: a change to how the per-worker
    streams are seeded would silently change every simulated result. These are the draws of
    seed 0 as of 2026-11 (numpy's default_rng([seed, worker, 0x5B]))."""
    p = Profile(ClusterConfig(compute="gamma", compute_ms=10, num_workers=2), seed=0)
    assert [p.step_s(0), p.step_s(1), p.step_s(0)] == [
        0.009303214294694875,
        0.009588481673865388,
        0.01106198098205043,
    ]


def test_a_ring_all_gather_forwards_one_piece_per_step():
    p = Network(ClusterConfig(num_workers=4, push_latency_ms=2, push_bandwidth_gbps=1))
    # N − 1 = 3 steps, each one piece of 1,000 bytes: 2 ms + 8 µs
    assert p.allgather_s(1000) == pytest.approx(3 * (0.002 + 8e-6))
    assert Network(ClusterConfig(num_workers=1, push_latency_ms=2)).allgather_s(1000) == 0.0


def test_a_ring_all_gather_step_lasts_as_long_as_its_slower_direction():
    p = Network(ClusterConfig(num_workers=3, push_latency_ms=1, pull_bandwidth_gbps=0.001))
    # each step receives a 1,000-byte piece at 1 Mbit/s: 8 ms, more than the 1 ms send
    assert p.allgather_s(1000) == pytest.approx(2 * 0.008)


def pauses(faults, times):
    """(step, at, seconds) of each pause struck when steps start at `times`."""
    out = []
    for step, now in enumerate(times):
        faults.strike(now, lambda at, s, step=step: out.append((step, at, s)))
    return out


def test_a_step_indexed_fault_strikes_at_that_step_whatever_the_time():
    p = profile(
        num_workers=2,
        faults=[
            FaultConfig(1, action="pause", duration_s=0.5, at_step=3),
            FaultConfig(1, 10.0, "pause", 2),  # by time, due at the step starting at 10
            FaultConfig(0, action="pause", duration_s=9, at_step=1),
        ],
    )
    times = [0.0, 4.0, 8.0, 9.0, 9.5, 11.0]
    assert pauses(Faults(p, 1), times) == [(3, 9.0, 0.5), (5, 11.0, 2)]
    assert pauses(Faults(p, 0), times) == [(1, 4.0, 9)]


def test_a_step_indexed_fault_before_a_time_fault_pushes_it_back():
    # the step fault's pause makes the time fault due at the same start
    p = profile(faults=[FaultConfig(0, 1.5, "pause", 1), FaultConfig(0, 0, "pause", 1, 2)])
    assert pauses(Faults(p, 0), [0.0, 0.5, 1.0]) == [(2, 1.0, 1), (2, 2.0, 1)]


def test_a_step_indexed_death_and_a_resumed_worker_s_faults():
    p = profile(faults=[FaultConfig(0, action="die", at_step=2), FaultConfig(0, 1.0, "pause", 1)])
    faults = Faults(p, 0)
    assert pauses(faults, [0.0, 0.1]) == []
    with pytest.raises(WorkerDied, match="worker 0 died at 0.200 s"):
        faults.strike(0.2, lambda at, s: None)
    # resumed at step 3 and run time 5: the death at step 2 and the pause at 1 s were struck
    assert Faults(p, 0, after_s=5.0, step=3).by_step == [] and not Faults(p, 0, 5.0, 3).pending
    assert [f.at_step for f in Faults(p, 0, after_s=0.5, step=2).by_step] == [2]


@pytest.mark.parametrize(
    "fault",
    [FaultConfig(0, 1.0, "die", at_step=3), FaultConfig(0, action="die", at_step=-2)],
    ids=["both", "negative"],
)
def test_a_fault_by_step_and_by_time_at_once_is_refused(fault):
    with pytest.raises(ConfigError, match=re.escape("must be at_step >= 0 (with at_s 0)")):
        ClusterConfig(name="profile", faults=[fault])


def slowness(faults, times):
    """`slow_s` in force for the sends of each step, steps starting at `times`."""
    out = []
    for now in times:
        faults.strike(now, lambda at, s: None)
        out.append(faults.slow_s)
    return out


def test_a_slow_fault_delays_the_sends_of_the_steps_in_its_window():
    p = profile(
        num_workers=2,
        faults=[
            FaultConfig(0, 1.0, "slow", 2.0, delay_ms=30),  # steps starting in [1, 3)
            FaultConfig(0, action="slow", at_step=2, delay_ms=5),  # from step 2 to the end
            FaultConfig(1, 0.5, "pause", 1),
        ],
    )
    assert slowness(Faults(p, 0), [0.0, 1.0, 2.0, 2.9, 3.0, 50.0]) == pytest.approx(
        [0.0, 0.03, 0.035, 0.035, 0.005, 0.005]
    )
    assert slowness(Faults(p, 1), [0.0, 1.0]) == [0.0, 0.0]  # a pause slows no send


def test_a_slow_fault_adds_its_delay_to_every_message_the_worker_sends():
    p = Network(ClusterConfig(num_workers=4, push_latency_ms=2, pull_latency_ms=1))
    assert p.push_s(1000, 0.03) == pytest.approx(0.002 + 0.03)
    assert p.pull_s(1000) == pytest.approx(0.001)  # what it receives is not slowed
    # a ring all-reduce: 2(N − 1) = 6 steps, each waits for the slow worker's chunk
    assert p.allreduce_s(1000, 0.03) == pytest.approx(6 * (0.002 + 0.03))
    assert p.allgather_s(1000, 0.03) == pytest.approx(3 * (0.002 + 0.03))


@pytest.mark.parametrize(
    "fault",
    [FaultConfig(0, 1.0, "slow"), FaultConfig(0, 1.0, "pause", 1, delay_ms=5)],
    ids=["slow-without-delay", "delay-without-slow"],
)
def test_a_slow_fault_needs_a_delay_and_only_it_has_one(fault):
    with pytest.raises(ConfigError, match=re.escape("cluster.faults[0].delay_ms must be > 0")):
        ClusterConfig(name="profile", faults=[fault])


def test_a_spare_in_a_lost_workers_place_is_not_struck_by_what_struck_its_predecessor():
    p = profile(
        faults=[
            FaultConfig(0, action="die", at_step=4),
            FaultConfig(0, action="pause", duration_s=1, at_step=6),
            FaultConfig(0, 2.0, "die"),
            FaultConfig(0, 3.0, "die"),
        ]
    )
    # died at the start of step 4; the spare starts its step 4 at once
    spare = Faults(p, 0, after_s=1.0, step=4, replaced=True)
    assert [f.at_step for f in spare.by_step] == [6]
    assert [f.at_s for f in spare.pending] == [2.0, 3.0]
    # died by time at 2.0 s, at step 9: the death at 3.0 s is still ahead of the spare
    spare = Faults(p, 0, after_s=2.0, step=9, replaced=True)
    assert spare.by_step == [] and [f.at_s for f in spare.pending] == [3.0]
    assert [f.at_s for f in Faults(p, 0, after_s=2.0, step=9).pending] == [2.0, 3.0]  # resumed

"""The cost model of a ring all-reduce (Network.allreduce_s) against hand-computed numbers,
and the sizes the allreduce engine counts, and what rank 0 reports of a round."""

import pytest

from stalebench.cluster import ClusterConfig
from stalebench.engines.rounds import ring_volume, round_bytes
from stalebench.runtime.network import Network


def profile(**kw):
    return Network(ClusterConfig(name="profile", **kw))


def symmetric(num_workers, latency_ms, bandwidth_gbps):
    """The same latency and bandwidth in both directions."""
    return profile(
        num_workers=num_workers,
        push_latency_ms=latency_ms,
        pull_latency_ms=latency_ms,
        push_bandwidth_gbps=bandwidth_gbps,
        pull_bandwidth_gbps=bandwidth_gbps,
    )


def test_symmetric_ring_is_2_n_minus_1_steps_of_latency_plus_chunk():
    # N = 4, 4,000 bytes: chunks of 1,000 B = 8,000 bit over 0.1 Gbit/s = 80 µs, + 1 ms
    p = symmetric(4, latency_ms=1, bandwidth_gbps=0.1)
    assert p.allreduce_s(4000) == pytest.approx(6 * 0.00108, rel=1e-12)  # 6.48 ms
    # N = 2: two steps of half the message (2,000 B = 160 µs at 0.1 Gbit/s)
    p2 = symmetric(2, latency_ms=1, bandwidth_gbps=0.1)
    assert p2.allreduce_s(4000) == pytest.approx(2 * 0.00116, rel=1e-12)


def test_each_step_costs_the_slower_direction():
    # send: 2 ms + 1,000 B at 1 Gbit/s = 2.008 ms; receive: 1 ms + 1,000 B at 0.1 Gbit/s
    # = 1.08 ms; the step takes 2.008 ms, six steps 12.048 ms
    p = profile(
        num_workers=4,
        push_latency_ms=2,
        pull_latency_ms=1,
        push_bandwidth_gbps=1,
        pull_bandwidth_gbps=0.1,
    )
    assert p.allreduce_s(4000) == pytest.approx(0.012048, rel=1e-12)
    # 400,000 B: send 2 ms + 0.8 ms = 2.8 ms; receive 1 ms + 8 ms = 9 ms: the receive wins
    assert p.allreduce_s(400_000) == pytest.approx(6 * 0.009, rel=1e-12)


def test_latency_only_and_free_networks():
    p = profile(num_workers=8, push_latency_ms=20, pull_latency_ms=20)
    assert p.allreduce_s(10**9) == pytest.approx(14 * 0.020, rel=1e-12)  # bandwidth unlimited
    assert profile(num_workers=8).allreduce_s(10**9) == 0.0


def test_one_worker_communicates_nothing():
    p = profile(num_workers=1, push_latency_ms=5, pull_latency_ms=5, push_bandwidth_gbps=0.1)
    assert p.allreduce_s(4000) == 0.0
    assert ring_volume(4000, 1) == 0


def test_the_engines_message_and_ring_volume():
    # d gradient slots, then compute time, loss and a spare per rank, then the stop flag
    assert round_bytes(100, 3) == 4 * (100 + 9 + 1)
    assert ring_volume(round_bytes(100, 3), 3) == 2 * 2 * 440  # all ranks together


def test_rank_zero_reports_each_pause_and_update_of_a_round(tmp_path):
    import torch

    from stalebench.engines.rounds import report_round
    from stalebench.metrics.events import EventLog, read_events

    log = EventLog(tmp_path / "events.jsonl")
    # (compute_s, loss, paused_s) per rank; rank 1 was slowest and paused 0.5 s first
    stats = torch.tensor([[0.125, 2.0, 0.0], [0.375, 1.0, 0.5]])
    report_round(log, 3.0, 7, stats, 0.5, 0.125)
    log.close()
    events = read_events(tmp_path / "events.jsonl")
    assert events[0] == {"kind": "worker", "t": 3.0, "worker": 1, "event": "pause",
                         "duration_s": 0.5}  # fmt: skip
    updates = [e for e in events if e["kind"] == "update"]
    assert all(e["t"] == 3.0 for e in updates)
    assert [(u["worker"], u["version"], u["clock"], u["lag"]) for u in updates] == [
        (0, 7, 6, 0),
        (1, 7, 6, 0),
    ]
    assert [u["wait_s"] for u in updates] == [0.25, 0.0]  # slowest − own compute
    # rank 0 spent 0.5 s in the all-reduce, 0.25 s of it waiting for rank 1
    assert [u["comm_s"] for u in updates] == [0.25, 0.25]
    assert [u["loss"] for u in updates] == [2.0, 1.0]

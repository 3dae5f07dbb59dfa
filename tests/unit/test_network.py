"""The network model (stalebench.runtime.network): a hub's link is a FIFO queue, a hub's NIC
one link each way for all its peers, and a topology's rack and WAN links are shared by
the messages that cross them, in the simulator and in real processes alike."""

from __future__ import annotations

import pytest

from stalebench.cluster import ClusterConfig
from stalebench.runtime.network import Calendars, Link, Network, Topology


def test_two_messages_through_one_link_take_twice_as_long_as_one():
    # a message that holds the link 0.5 s, its last byte in at 1.0 s: alone it is through
    # then (its bytes streamed in as they were sent); two such at once, the second is
    # through 0.5 s later — the link carried 1 s of bytes, twice one message's
    alone = Link()
    assert alone.take(1.0, 0.5) == 1.0
    both = Link()
    assert [both.take(1.0, 0.5), both.take(1.0, 0.5)] == [1.0, 1.5]
    # sends: the second leaves when the first is through
    up = Link()
    assert [up.leave(0.0, 0.5), up.leave(0.0, 0.5)] == [0.0, 0.5]
    assert up.free_at == 1.0


def test_a_link_free_between_messages_costs_nothing_extra():
    link = Link()
    assert [link.take(t, 0.5) for t in (1.0, 2.0, 2.5)] == [1.0, 2.0, 2.5]
    assert [link.leave(t, 0.5) for t in (3.0, 4.0)] == [3.0, 4.0]


def test_a_hub_link_carries_its_bytes_at_its_bandwidth():
    net = Network(ClusterConfig(push_latency_ms=2, push_bandwidth_gbps=0.1))
    # 1 MB at 100 Mbit/s: 80 ms on the wire; the latency is spent on the way, not on a link
    assert net.push_wire_s(1_000_000) == pytest.approx(0.08)
    assert net.push_s(1_000_000) == pytest.approx(0.082)
    assert Network(ClusterConfig()).pull_wire_s(10**9) == 0.0


# ---- a topology: racks with shared uplinks, regions over a WAN (Topology, Calendars) ----

MB = 1_000_000  # 8 ms at 1 Gbit/s


def topology(size: int, **cluster) -> Network:
    cfg = ClusterConfig(num_workers=size, **cluster)
    topo = Topology(cfg, size)
    topo.calendars = Calendars.local(topo.links, size)
    return Network(cfg, topo)


RACKS = dict(rack_size=2, rack_bandwidth_gbps=1.0, rack_latency_ms=1.0)
REGIONS = dict(
    rack_size=2, rack_bandwidth_gbps=10.0, region_size=1,
    wan_bandwidth_gbps=[[0, 0.5], [0.25, 0]], wan_latency_ms=[[0, 40], [60, 0]],
)  # fmt: skip


def test_ranks_fill_hosts_racks_and_regions_in_rank_order():
    net = topology(5, **REGIONS)
    topo = net.topology
    assert [topo.rack(r) for r in range(5)] == [0, 0, 1, 1, 2]
    assert [topo.region(r) for r in range(5)] == [0, 0, 1, 1, 2]
    assert (topo.racks, topo.regions, topo.links) == (3, 3, 2 * 3 + 9)
    # one rack: no shared link, the network as it was
    assert (
        Network(ClusterConfig(rack_size=8), Topology(ClusterConfig(rack_size=8), 4)).topology
        is None
    )


def test_a_message_within_a_rack_pays_no_level():
    net = topology(4, **RACKS)
    assert net.topology.hops(0, 1) == []
    assert net.cross(0, 1, MB, 5.0, 0.0) == 0.0


def test_a_message_between_racks_pays_the_rack_level():
    net = topology(4, **RACKS)
    # up rack 0's uplink, down rack 1's downlink: the latency once, 1 MB at 1 Gbit/s
    assert [h[0] for h in net.topology.hops(0, 2)] == [0, 3]
    assert net.cross(0, 2, MB, 5.0, 0.0) == pytest.approx(0.001 + 0.008)
    # a NIC as slow as the uplink already streamed the bytes at that pace: the latency only
    assert net.cross(1, 3, MB, 10.0, 0.008) == pytest.approx(0.001)
    # a NIC twice as fast as the uplink: the difference
    assert net.cross(0, 2, MB, 20.0, 0.004) == pytest.approx(0.001 + 0.004)


def test_a_message_between_regions_pays_the_wan_link_of_the_pair():
    net = topology(4, **REGIONS)
    # region 0 → 1: 40 ms, 0.5 Gbit/s (16 ms for 1 MB); 1 → 0: 60 ms, 0.25 Gbit/s (32 ms)
    assert net.cross(0, 2, MB, 5.0, 0.0) == pytest.approx(0.040 + 0.016)
    assert net.cross(2, 0, MB, 5.0, 0.0) == pytest.approx(0.060 + 0.032)
    # two ranks of one region: the rack level only (10 Gbit/s, no latency)
    assert topology(4, **{**REGIONS, "region_size": 2}).cross(0, 2, MB, 5.0, 0.0) == (
        pytest.approx(0.0008)
    )


@pytest.mark.parametrize("level", ["rack", "wan"])
def test_two_messages_through_one_shared_link_take_twice_as_long_as_one(level):
    net = topology(4, **(RACKS if level == "rack" else REGIONS))
    latency, wire = (0.001, 0.008) if level == "rack" else (0.040, 0.016)
    one = net.cross(0, 2, MB, 5.0, 0.0)
    two = net.cross(1, 3, MB, 5.0, 0.0)  # the other host of the rack, at the same time
    assert one == pytest.approx(latency + wire)
    assert two == pytest.approx(latency + 2 * wire)  # behind the first on the shared link
    # later, the link free again: one message's time
    assert net.cross(1, 3, MB, 9.0, 0.0) == pytest.approx(latency + wire)


def test_a_shared_link_never_carries_more_than_its_bandwidth_whatever_the_booking_order():
    import itertools
    import random

    cal = Calendars.local(1, 4)
    rng = random.Random(0)
    booked = []
    for _ in range(40):  # messages booked out of time order, as a simulator's ranks may
        ready, seconds = rng.uniform(0, 1), rng.uniform(0.001, 0.05)
        start = cal.book(0, ready, seconds)
        assert start >= ready
        booked.append((start, start + seconds))
    booked.sort()
    assert all(a[1] <= b[0] + 1e-12 for a, b in itertools.pairwise(booked))


def test_the_shared_bookings_of_real_processes_live_in_one_file(tmp_path):
    a = Calendars.shared(tmp_path / "links", 2, 4)
    b = Calendars.shared(tmp_path / "links", 2, 4)  # another rank's map of the same file
    assert a.book(1, 1.0, 0.5) == 1.0
    assert b.book(1, 1.0, 0.5) == 1.5  # behind the first rank's message
    assert b.book(0, 1.0, 0.5) == 1.0  # another link: free


def test_a_collective_over_racks_is_hierarchical_and_one_rack_is_the_ring():
    flat = Network(ClusterConfig(num_workers=4, push_bandwidth_gbps=1, pull_bandwidth_gbps=1))
    assert flat.allreduce_s(MB) == pytest.approx(2 * 3 * 0.002)  # 2(N−1) steps of 1/N
    racks = topology(4, **RACKS, push_bandwidth_gbps=1, pull_bandwidth_gbps=1)
    # within each rack of 2: 2 steps of 0.5 MB (4 ms each); between the 2 racks: 2 steps
    # of 0.5 MB through an uplink (4 ms + 1 ms latency each)
    assert racks.allreduce_s(MB) == pytest.approx(2 * 0.004 + 2 * (0.001 + 0.004))
    # all-gather of 1 MB each: the racks swap their 2 hosts' pieces (2 MB, 16 ms + 1 ms),
    # then each rack's ring forwards 2 MB (16 ms)
    assert racks.allgather_s(MB) == pytest.approx(0.017 + 0.016)
    regions = topology(4, **REGIONS)  # racks of 2 in regions of 1: the WAN's slowest pair
    assert regions.allreduce_s(MB) == pytest.approx(2 * (0.060 + 0.5 * MB * 8 / 0.25e9))


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"region_size": 1}, "cluster.region_size"),
        ({"rack_size": -1}, "cluster.rack_size"),
        ({"rack_size": 2, "region_size": 1, "wan_bandwidth_gbps": [[0, 1]]}, "wan_bandwidth_gbps"),
        ({"rack_size": 2, "region_size": 1}, "cluster.wan_bandwidth_gbps"),
        ({"rack_size": 2, "wan_latency_ms": [[0]]}, "cluster.wan_latency_ms"),
    ],
)
def test_a_bad_topology_is_refused_by_its_key(keys, named):
    from stalebench.errors import ConfigError

    with pytest.raises(ConfigError, match=named):
        ClusterConfig(**keys)


def test_more_regions_than_the_wan_matrix_has_is_refused_naming_both():
    from stalebench.cluster import check_regions
    from stalebench.errors import ConfigError

    cfg = ClusterConfig(num_workers=8, **{**REGIONS})
    check_regions(cfg, 4)  # 2 racks, 2 regions: the matrix's size
    with pytest.raises(ConfigError, match=r"has 2 regions.*9 ranks fill 5 racks"):
        check_regions(cfg, 9)


def test_an_emulated_wait_counts_and_a_wait_that_woke_late_is_late():
    import sys
    import threading
    import time

    from stalebench.runtime.faults import Waits

    waits = Waits()
    waits.until(time.perf_counter() - 1.0, 0.01)  # its end already past: no wait
    waits.sleep(0.0)  # a free network: no wait
    assert (waits.count, waits.late) == (0, 0)
    waits.sleep(0.002)  # a short sleep: on time when this process has a core
    assert waits.count == 1
    late = waits.late  # 0 on an idle machine; 1 where the cores are busy (a suite, a sweep)
    # a thread that keeps the interpreter for 0.2 s at a time: the sleeper wakes on time but
    # gets to run only once the thread lets go of it, far past its end
    switch, spinning, stop = sys.getswitchinterval(), threading.Event(), threading.Event()

    def spin() -> None:
        spinning.set()
        while not stop.is_set():
            pass

    sys.setswitchinterval(0.2)
    try:
        thread = threading.Thread(target=spin)
        thread.start()
        spinning.wait()
        start = time.perf_counter()
        waits.sleep(0.01)
        woke = time.perf_counter() - start
    finally:
        stop.set()
        sys.setswitchinterval(switch)
        thread.join()
    assert woke > 0.05  # the interpreter was the thread's
    assert (waits.count, waits.late) == (2, late + 1)  # the wait woke late

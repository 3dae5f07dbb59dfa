"""The network model's transports and collective algorithms (stalebench.runtime.collectives,
stalebench.transports), each against its cost worked out by hand: 1 MB is 8 ms at 1 Gbit/s."""

from __future__ import annotations

import pytest

from stalebench.cluster import ClusterConfig
from stalebench.errors import ConfigError
from stalebench.runtime import collectives
from stalebench.runtime.network import Calendars, Link, Network, Topology
from stalebench.transports import PLACEMENTS

MB = 1_000_000
ALPHA = 0.001  # 1 ms each way
WIRE = 0.008  # 1 MB at 1 Gbit/s


def net(n: int, **cluster) -> Network:
    cluster = dict(
        num_workers=n, push_latency_ms=1, pull_latency_ms=1,
        push_bandwidth_gbps=1, pull_bandwidth_gbps=1, **cluster,
    )  # fmt: skip
    return Network(ClusterConfig(**cluster))


def test_a_ring_is_2_n_minus_1_steps_of_a_chunk():
    # 4 ranks, 4 MB: 6 steps of (1 ms + 1 MB at 1 Gbit/s)
    assert net(4, collective="ring").allreduce_s(4 * MB) == pytest.approx(6 * (ALPHA + WIRE))
    assert net(4).allreduce_s(4 * MB) == net(4, collective="ring").allreduce_s(4 * MB)
    # an all-gather of 1 MB from each: 3 steps of 1 MB
    assert net(4, collective="ring").allgather_s(MB) == pytest.approx(3 * (ALPHA + WIRE))


def test_recursive_doubling_exchanges_the_whole_buffer_log2_n_times():
    one = ALPHA + WIRE  # a whole 1 MB buffer
    assert net(4, collective="recursive_doubling").allreduce_s(MB) == pytest.approx(2 * one)
    assert net(8, collective="recursive_doubling").allreduce_s(MB) == pytest.approx(3 * one)
    # 5 ranks: the fifth folds into rank 0 and gets the sum back, 2 steps more
    assert net(5, collective="recursive_doubling").allreduce_s(MB) == pytest.approx(4 * one)
    # all-gather over 4: 1 piece, then 2
    gathered = (ALPHA + WIRE) + (ALPHA + 2 * WIRE)
    assert net(4, collective="recursive_doubling").allgather_s(MB) == pytest.approx(gathered)


def test_a_tree_reduces_then_broadcasts_in_log2_n_rounds_each():
    one = ALPHA + WIRE
    assert net(4, collective="tree").allreduce_s(MB) == pytest.approx(4 * one)  # 2 + 2
    assert net(5, collective="tree").allreduce_s(MB) == pytest.approx(6 * one)  # 3 + 3
    assert net(32, collective="tree").allreduce_s(MB) == pytest.approx(10 * one)


def test_hierarchical_is_inside_the_host_across_the_hosts_inside_again():
    # 8 ranks on 2 hosts of 4, a host link of 100 Gbit/s and no latency, 8 MB:
    # reduce-scatter and all-gather inside (2 × 3 steps of 2 MB at 100 Gbit/s), a ring
    # across the 2 hosts of every rank's shard at once: 2 × 1 steps of 4 MB through the NIC
    n = net(8, collective="hierarchical", gpus_per_host=4, host_link_gbps=100)
    inside = 2 * 3 * (2 * MB * 8 / 100e9)
    across = 2 * 1 * (ALPHA + 4 * WIRE)
    assert n.allreduce_s(8 * MB) == pytest.approx(inside + across)
    # one GPU a host: a ring
    assert net(8, collective="hierarchical").allreduce_s(8 * MB) == net(8).allreduce_s(8 * MB)


def test_a_hosts_ranks_share_its_nic():
    link = dict(gpus_per_host=2, host_link_gbps=100)
    # recursive doubling over 4 ranks on 2 hosts: distance 1 inside the host (1 MB on the
    # link), distance 2 across, both ranks of a host at once: 2 MB through one NIC
    rd = net(4, collective="recursive_doubling", **link).allreduce_s(MB)
    assert rd == pytest.approx(MB * 8 / 100e9 + ALPHA + 2 * WIRE)
    # a ring crosses each NIC once a step: as fast as one rank a host
    assert net(4, **link).allreduce_s(4 * MB) == pytest.approx(6 * (ALPHA + WIRE))
    # a tree: round 0 inside, round 1 across (one rank a host sends), both ways
    tree = net(4, collective="tree", **link).allreduce_s(MB)
    assert tree == pytest.approx(2 * (MB * 8 / 100e9 + ALPHA + WIRE))
    # messages: two ranks of host 0 sending to host 1 at once queue on its NIC
    cfg = ClusterConfig(num_workers=4, push_bandwidth_gbps=1, pull_bandwidth_gbps=1, **link)
    topo = Topology(cfg, 4)
    topo.calendars = Calendars.local(topo.links, 4)
    shared = Network(cfg, topo)
    assert shared.topology is not None and topo.hops(0, 1) == []  # same host: no NIC
    assert shared.cross(0, 2, MB, WIRE, WIRE) == 0.0  # the first has the NIC to itself
    assert shared.cross(1, 3, MB, WIRE, WIRE) == pytest.approx(WIRE)  # the second waits


def test_a_transport_prices_its_share_of_line_rate_and_its_fixed_costs():
    ideal = net(4).allreduce_s(4 * MB)
    gloo = net(4, transport="gloo_tcp")
    # 21 % of line rate, 0.35 ms a collective
    assert gloo.allreduce_s(4 * MB) == pytest.approx(6 * (ALPHA + WIRE / 0.21) + 0.00035)
    assert gloo.allreduce_s(4 * MB) > ideal
    # a cost a message: every step of the ring and every message pays it
    costly = net(4, message_ms=0.5)
    assert costly.allreduce_s(4 * MB) == pytest.approx(6 * (ALPHA + 0.0005 + WIRE))
    assert costly.push_s(MB) == pytest.approx(ALPHA + 0.0005 + WIRE)
    # overrides win over the preset
    assert net(4, transport="gloo_tcp", efficiency=1.0, collective_ms=0).allreduce_s(
        4 * MB
    ) == pytest.approx(ideal)


def test_a_transport_no_source_pins_needs_its_number_given():
    with pytest.raises(ConfigError, match="cluster.efficiency.*thd_tcp"):
        ClusterConfig(transport="thd_tcp")
    with pytest.raises(ConfigError, match="cluster.transport: unknown 'tcp'"):
        ClusterConfig(transport="tcp")
    with pytest.raises(ConfigError, match="cluster.collective must be one of"):
        ClusterConfig(collective="butterfly")
    with pytest.raises(ConfigError, match="cluster.host_link"):
        ClusterConfig(gpus_per_host=8)
    assert net(4, transport="thd_tcp", efficiency=0.5).algorithm == "recursive_doubling"


def test_a_gpu_stages_its_bytes_through_host_memory_where_the_transport_needs_it():
    stage = 8 / 96e9  # PCIe 3.0 x16's 12 GB/s a byte
    staged = net(4, transport="thd_tcp", efficiency=1.0, device="v100")
    assert staged.push_s(MB) == pytest.approx(ALPHA + WIRE + MB * stage)
    doubling = 2 * (ALPHA + WIRE)  # THD's recursive doubling over 4
    assert staged.allreduce_s(MB) == pytest.approx(doubling + 2 * MB * stage)  # down and up
    cpu = net(4, transport="thd_tcp", efficiency=1.0, device="xeon_e5_2697v3")
    assert cpu.allreduce_s(MB) == pytest.approx(doubling)  # a CPU's bytes are in host memory
    assert net(4, transport="nccl_ib", efficiency=0.9, device="v100").stage_s == 0.0


def test_pipelined_messages_overlap_their_latencies_serial_ones_do_not():
    # two 1 MB messages one after the other on one uplink
    for pipelined, second in ((True, WIRE + WIRE + ALPHA), (False, 2 * (WIRE + ALPHA))):
        up, down = collectives.Busy(), collectives.Busy()
        ends = [collectives._message(up, down, 0.0, WIRE, ALPHA, 0.0, pipelined) for _ in "ab"]
        assert ends == pytest.approx([WIRE + ALPHA, second])
    # a worker's send: held for all of it, or all but the latency
    assert net(2).hold_s(MB) == pytest.approx(ALPHA + WIRE) and net(2).flight_s() == 0
    assert net(2, pipelined=True).hold_s(MB) == pytest.approx(WIRE)
    assert net(2, pipelined=True).flight_s() == pytest.approx(ALPHA)


def test_mxnet_and_p3_place_a_tensor_whole_or_split_over_the_servers():
    mxnet, p3 = PLACEMENTS["mxnet"], PLACEMENTS["p3"]
    # tensor 5 of 10 elements over 4 servers: whole on (5 × 9973) mod 4 = 1
    assert mxnet.parts([(5, 0, 10, 10)], 4) == {(5 * 9973) % 4: 10} == {1: 10}
    assert mxnet.parts([(5, 0, 999_999, 999_999)], 4) == {1: 999_999}
    # 1,000,000 elements or more: a quarter on each server
    assert mxnet.parts([(5, 0, 1_000_000, 1_000_000)], 4) == {s: 250_000 for s in range(4)}
    # P3: slices of 40,000 round the servers; a piece that is slice 6 of a tensor is on 2
    assert p3.parts([(0, 240_000, 280_000, 1_000_000)], 4) == {2: 40_000}
    assert p3.parts([(3, 0, 39_999, 39_999)], 4) == {(3 * 9973) % 4: 39_999}
    # a piece holding two small tensors: each on its own server
    assert p3.parts([(0, 0, 10, 10), (1, 0, 20, 20)], 2) == {0: 10, 1: 20}


def test_a_sharded_server_pushes_then_pulls_each_key():
    # 2 workers, servers on their hosts, pipelined: one 8 MB tensor (2,000,000 elements,
    # over MXNet's bound) is split over both servers; each worker pushes its 4 MB half to the other
    # host (1 ms + 32 ms) and, once it is in, pulls the other half back: 2 × 33 ms, which
    # is also the ring's 2 (N − 1) (α + S / (N β)) at N = 2
    ps = net(2, collective="sharded_ps", pipelined=True)
    assert ps.piece_ends([8 * MB], [0], [0.0]) == pytest.approx([2 * (ALPHA + 4 * WIRE)])
    # two small keys made at once go to servers 0 and 1 ((k × 9973) mod 2): their pushes
    # and pulls run side by side, both summed at α + 8 ms + α + 8 ms
    both = ps.piece_ends([MB, MB], [0, 1], [0.0, 0.0])
    assert both == pytest.approx([2 * (ALPHA + WIRE)] * 2)
    # keys 0 and 2 both on server 0: worker 1's two pushes queue on its uplink, then the
    # server's two replies on its own
    same = ps.piece_ends([MB, 0, MB], [0, 2, 1], [0.0, 0.0, 0.0])
    assert same[0] == pytest.approx(2 * (ALPHA + WIRE))
    assert same[2] == pytest.approx(2 * (ALPHA + WIRE) + WIRE)


def test_no_new_key_prices_as_before():
    # the ring of the model before transports: 2(N − 1)(α + S/(N β)), nothing added
    n = net(32)
    assert n.allreduce_s(102 * MB) == 2 * 31 * (ALPHA + (102 * MB / 32) * 8 / 1e9)
    assert n.push_s(MB) == ALPHA + WIRE and n.flight_s() == 0.0


def test_a_sharded_servers_queue_sends_by_priority_what_is_made():
    ps = net(2, collective="sharded_ps", pipelined=True)
    # piece 1 first in the order but made 20 ms late: piece 0, made at once, does not
    # wait for it (P3's sender queue holds what is made, by priority)
    ends = ps.piece_ends([MB, MB], [1, 0], [0.0, 0.020])
    assert ends[0] == pytest.approx(2 * (ALPHA + WIRE))
    assert ends[1] == pytest.approx(0.020 + 2 * (ALPHA + WIRE))
    # keys 0 and 2 on server 0, both made at once: the one first in the order goes first
    first, _, second = ps.piece_ends([MB, 0, MB], [2, 0, 1], [0.0, 0.0, 0.0])
    assert second == pytest.approx(2 * (ALPHA + WIRE)) and first > second


def test_a_message_between_two_gpus_of_one_host_takes_its_link():
    # 4 ranks on 2 hosts of 2, nvlink2 (its latency and bandwidth): rank 0 to rank 1 over
    # the link, held for all of it (nothing in flight), no NIC, no shared link, no queue
    n = net(4, gpus_per_host=2, host_link="nvlink2")
    inside = n.between(0, 1)
    assert inside.hold_s(MB) == pytest.approx(n.link_s(MB)) and inside.flight_s() == 0.0
    assert n.link_s(MB) == pytest.approx(n.link_ms / 1000 + MB * 8 / (n.link_gbps * 1e9))
    assert inside.hold_s(MB, 0.002) == pytest.approx(n.link_s(MB) + 0.002)  # a slow fault
    assert inside.pull_s(MB) == pytest.approx(n.link_s(MB))  # a hub's, paid by its receiver
    assert inside.cross(0, 1, MB, 1.0, WIRE) == 0.0
    busy = Link()
    busy.leave(0.0, 10.0)  # a NIC busy for 10 s each way: the link's messages do not queue
    assert inside.peer_through(busy, 1.0, MB) == 1.0 and inside.take(busy, 1.0, WIRE) == 1.0
    assert inside.leave(busy, 1.0, WIRE) == 1.0
    # to the other host: the NIC's, queued behind what holds it
    assert n.between(0, 2) is n and n.between(0, 2).hold_s(MB) == pytest.approx(ALPHA + WIRE)
    assert n.leave(busy, 1.0, WIRE) == 10.0
    assert n.take(busy, 1.0, WIRE) == pytest.approx(10.0 + 2 * WIRE)
    single = net(4)  # one GPU a host: every message the NIC's
    assert single.between(0, 1) is single

"""The network model (stalebench.runtime.network): a link is a FIFO queue, and a hub's NIC
is one link each way for all its peers, in the simulator and in real processes alike."""

from __future__ import annotations

import pytest

from stalebench.cluster import ClusterConfig
from stalebench.runtime.network import Link, Network


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

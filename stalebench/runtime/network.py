"""The network model, one for both runtimes: what a message or a collective costs, and the
links that messages share.

The cluster is one switch (a star): every rank sits on a host of its own, whose NIC has an
uplink and a downlink. A message from a worker is the push direction (`cluster.push_*`), a
message to a worker the pull direction (`cluster.pull_*`); each costs its direction's
latency plus its bytes ÷ its bandwidth (`push_s`, `pull_s`; bandwidth 0 = unlimited). A
hub (a parameter server, engine=local's asynchronous server) has one NIC for all its peers,
the same as a worker's seen from the other end: its downlink carries every push at the push
bandwidth, its uplink every reply at the pull bandwidth.

Who pays what, in both runtimes (`World` implements it; no engine prices a message):

- a worker's send occupies its uplink: it is blocked for the message's push time, one send
  after the other (its uplink is a queue by construction);
- a worker's receive pays the pull time once the message has left the other end;
- a hub's downlink (`Link`) takes the messages that reach it one at a time, in the order
  they arrive: a message is delivered no sooner than it arrives, nor than the one before
  it is through plus its own transfer (bytes ÷ push bandwidth);
- a hub's message leaves once its uplink is free of the ones before it (bytes ÷ pull
  bandwidth each), the hub going on meanwhile (its NIC sends while it computes); its
  receiver then pays the pull time from there.

A link is FIFO, not fairly shared. Over a real NIC, TCP shares a bottleneck between
concurrent connections about fairly, so N messages that reach a server at once all finish
near N·t (t = one message's transfer) instead of at t, 2t, …, N·t; but the link's
throughput — what bounds a server's updates per second — is the same under both, and one
connection is itself a FIFO byte stream. FIFO keeps each message's delivery fixed once it
is taken, which the simulator's order of events needs; its error is in the order of
deliveries within a burst, never in how many bytes a second a link carries.

A link on which no two messages ever overlap costs exactly what the per-message formula
says: such a run's events are what they were before links were shared.

Collectives are costed on the same parameters: a ring all-reduce or all-gather over the N
workers (`allreduce_s`, `allgather_s`), one collective at a time per rank (its links carry
one ring step at a time).
"""

from __future__ import annotations

import math

from stalebench.cluster import ClusterConfig


class Link:
    """One direction of a NIC, a FIFO queue: `take(arrival, seconds)` is when a message
    that arrives at `arrival` and holds the link `seconds` is through (times in seconds on
    any one clock, virtual or `time.perf_counter`)."""

    def __init__(self) -> None:
        self.free_at = -math.inf  # when the last message taken is through

    def take(self, arrival: float, seconds: float) -> float:
        """Its transfer overlaps its arrival when the link is free (the bytes stream in as
        the sender sends them); behind another message it starts once that one is through."""
        self.free_at = max(arrival, self.free_at + seconds)
        return self.free_at

    def leave(self, now: float, seconds: float) -> float:
        """A message sent at `now` on this link: when it starts (the one before it through);
        the link is then busy for `seconds`."""
        start = max(now, self.free_at)
        self.free_at = start + seconds
        return start


class Network:
    """The prices of the cluster's messages and collectives (seconds), from
    `cluster.push_*`/`pull_*` and the number of workers."""

    def __init__(self, cfg: ClusterConfig):
        self.cfg = cfg

    def push_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of one message from a worker; `slow_s` is what a slow fault adds to each
        message that worker sends (`Faults.slow_s`)."""
        return _delay(self.cfg.push_latency_ms, self.cfg.push_bandwidth_gbps, nbytes) + slow_s

    def pull_s(self, nbytes: float) -> float:
        return _delay(self.cfg.pull_latency_ms, self.cfg.pull_bandwidth_gbps, nbytes)

    def push_wire_s(self, nbytes: float) -> float:
        """How long a message to a hub holds the hub's downlink: its bytes at the push
        bandwidth (no latency: that is spent on the way)."""
        return _delay(0.0, self.cfg.push_bandwidth_gbps, nbytes)

    def pull_wire_s(self, nbytes: float) -> float:
        """How long a hub's message holds its uplink: its bytes at the pull bandwidth."""
        return _delay(0.0, self.cfg.pull_bandwidth_gbps, nbytes)

    def allreduce_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of a ring all-reduce of `nbytes` over the N workers: 2(N − 1) steps of a
        chunk of nbytes/N each, 2(N − 1)·(α + nbytes/(N·β)) when both directions have latency
        α and bandwidth β (N = 1: 0).

        In each step every worker sends a chunk to the next worker (charged the push
        direction's latency and bandwidth) while it receives one from the previous (the pull
        direction's); the step lasts as long as the slower of the two, because the next step
        forwards the chunk just received. A worker whose sends a slow fault delays by `slow_s`
        makes every step that much longer: the next step waits for its chunk.
        """
        n = self.cfg.num_workers
        chunk = nbytes / n
        step = max(self.push_s(chunk), self.pull_s(chunk))
        return 2 * (n - 1) * (step + slow_s)

    def allgather_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of a ring all-gather of one `nbytes` piece from each of the N workers:
        N − 1 steps, each forwarding one piece (the slower direction, as `allreduce_s`)."""
        n = self.cfg.num_workers
        return (n - 1) * (max(self.push_s(nbytes), self.pull_s(nbytes)) + slow_s)

    def priority_order(self, sizes: list[int], ready: list[float]) -> list[int]:
        """The order in which pieces of `sizes` bytes, made at `ready` seconds, go over a
        rank's link as ring all-reduces under a priority schedule (P3): whenever the link is
        free, the made piece nearest the input (the lowest index) first."""
        order, t, left = [], 0.0, set(range(len(ready)))
        while left:
            made = [k for k in left if ready[k] <= t]
            if not made:
                t = min(ready[k] for k in left)
                continue
            order.append(min(made))
            left.remove(order[-1])
            t += self.allreduce_s(sizes[order[-1]])
        return order


def _delay(latency_ms: float, bandwidth_gbps: float, nbytes: float) -> float:
    transfer = nbytes * 8 / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0
    return latency_ms / 1000.0 + transfer

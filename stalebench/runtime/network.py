"""The network model, one for both runtimes: what a message or a collective costs, and the
links that messages share.

Without a topology the cluster is one switch (a star): every rank sits on a host of its
own, whose NIC has an uplink and a downlink. A message from a worker is the push direction
(`cluster.push_*`), a message to a worker the pull direction (`cluster.pull_*`); each costs
its direction's latency plus its bytes ÷ its bandwidth (`push_s`, `pull_s`; bandwidth 0 =
unlimited). A hub (a parameter server, engine=local's asynchronous server) has one NIC for
all its peers, the same as a worker's seen from the other end: its downlink carries every
push at the push bandwidth, its uplink every reply at the pull bandwidth.

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

Hosts of several GPUs (`cluster.gpus_per_host`) put that many ranks on a host, sharing
its NIC; a message between two ranks of one host takes the host's link instead
(`Network.between` gives its prices, `HostLink`): no NIC, no queue, its sender or (a hub's)
its receiver paying the link's latency and bytes.

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

A topology (`Topology`, from `cluster.rack_size`, `region_size` and their links) puts the
hosts in racks and the racks in regions. A message between racks also crosses its sender's
rack uplink, the WAN link of the two regions if they differ, and its receiver's rack
downlink, paying each level's latency; each of those links is shared by every message that
crosses it (`Calendars`: a message holds a link for its bytes at the link's bandwidth, in
the first free interval from when its first byte gets there, so a link never carries more
than its bandwidth, whatever order the runtime books its messages in). Its bytes stream
through (cut-through): a free link as fast as the NIC costs only its latency, a slower one
the difference. Who waits: a worker's send is held until its message is across (as its
send is held for its own NIC: the sender's TCP stream cannot run ahead of the bottleneck);
a hub's message reaches its receiver that much later, the hub going on. A collective over
a topology is hierarchical: a ring within each rack, then among the racks of a region
through their uplinks, then among the regions over the WAN, each level's ring costed at
its latency and bandwidth (`allreduce_s`). No levels (one rack) costs what it did before.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stalebench import transports
from stalebench.cluster import DEVICES, ClusterConfig

if TYPE_CHECKING:
    from stalebench.runtime.collectives import Sharded

SLOTS = 64  # bookings a shared link remembers, beside 4 per rank (the oldest forgotten)


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


class Calendars:
    """The bookings of a topology's shared links (rack uplinks and downlinks, WAN links):
    `slots[link]` holds the intervals (start, end) each link is busy, on one clock. In the
    simulator an array of the process; in real processes a file in the machine's shared
    memory that every rank maps, each booking under the file's lock (`shared`)."""

    def __init__(self, slots: np.ndarray, lock_fd: int | None = None):
        self.slots, self.lock_fd = slots, lock_fd

    @classmethod
    def local(cls, links: int, size: int) -> Calendars:
        return cls(np.zeros((links, SLOTS + 4 * size, 2)))

    @classmethod
    def shared(cls, path: Path, links: int, size: int) -> Calendars:
        """Every rank maps the same file (the same size; zeros are no booking)."""
        shape = (links, SLOTS + 4 * size, 2)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, int(np.prod(shape)) * 8)
        return cls(np.memmap(path, dtype=np.float64, mode="r+", shape=shape), fd)

    def book(self, link: int, ready: float, seconds: float) -> float:
        """The start of the first interval of `seconds` from `ready` on that the link has
        free; it is then booked."""
        if seconds <= 0:
            return ready
        lock = self._locked() if self.lock_fd is not None else contextlib.nullcontext()
        with lock:
            slots = self.slots[link]
            busy = slots[slots[:, 1] > ready]
            start = ready
            for begin, end in busy[np.argsort(busy[:, 0])]:
                if begin >= start + seconds:
                    break
                start = max(start, float(end))
            slots[int(np.argmin(slots[:, 1]))] = (start, start + seconds)
            return start

    @contextlib.contextmanager
    def _locked(self):
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)


class Topology:
    """Where the `size` ranks sit: rank r on host r, hosts in racks of `cluster.rack_size`
    in rank order, racks in regions of `cluster.region_size`; the shared links between them
    (`links`: each rack's uplink 2k and downlink 2k + 1, then region a's WAN link to region
    b) and their bookings (`calendars`, set by the runtime: `Calendars`)."""

    def __init__(self, cfg: ClusterConfig, size: int):
        self.cfg, self.size = cfg, size
        self.racks = math.ceil(size / cfg.rack_size) if cfg.rack_size else 1
        self.regions = math.ceil(self.racks / cfg.region_size) if cfg.region_size else 1
        # hosts of several GPUs (`cluster.gpus_per_host`; never with racks): each host's NIC,
        # uplink and downlink, after the racks' and WAN links
        self.gpus = cfg.gpus_per_host
        self.hosts = math.ceil(size / self.gpus) if self.gpus > 1 else 0
        self.links = 2 * self.racks + self.regions**2 + 2 * self.hosts
        self.calendars: Calendars | None = None

    @property
    def flat(self) -> bool:
        """One rack of hosts of one rank: no message crosses a shared link."""
        return self.racks == 1 and self.hosts <= 1

    def rack(self, rank: int) -> int:
        return rank // self.cfg.rack_size if self.cfg.rack_size else 0

    def region(self, rank: int) -> int:
        return self.rack(rank) // self.cfg.region_size if self.cfg.region_size else 0

    def hops(self, src: int, dst: int) -> list[tuple[int, float, float]]:
        """(link, latency s, bandwidth Gbit/s) of each shared link a message from rank `src`
        to rank `dst` crosses, in order; none within a rack."""
        c, a, b = self.cfg, self.rack(src), self.rack(dst)
        if self.hosts:  # the senders' host's NIC uplink, the receiver's host's downlink
            host, other = src // self.gpus, dst // self.gpus
            if host == other:
                return []
            base, rate = 2 * self.racks + self.regions**2, efficiency(c)
            return [
                (base + 2 * host, 0.0, c.push_bandwidth_gbps * rate),
                (base + 2 * other + 1, 0.0, c.pull_bandwidth_gbps * rate),
            ]
        if a == b:
            return []
        hops = [(2 * a, c.rack_latency_ms / 1000, c.rack_bandwidth_gbps)]
        g, h = self.region(src), self.region(dst)
        if g != h:
            latency = c.wan_latency_ms[g][h] / 1000 if c.wan_latency_ms else 0.0
            hops.append(
                (2 * self.racks + g * self.regions + h, latency, c.wan_bandwidth_gbps[g][h])
            )
        return [*hops, (2 * b + 1, 0.0, c.rack_bandwidth_gbps)]

    def cross(self, src: int, dst: int, nbytes: float, last: float, nic_s: float) -> float:
        """The seconds a message of `nbytes` from `src` to `dst` whose last byte left its
        sender's NIC at `last` (its bytes took `nic_s` there) takes beyond that to be across
        every shared link on its way (each booked in `calendars`): their latencies, the
        queue behind other messages, and what a link slower than the NIC adds."""
        first, end = last - nic_s, last
        for link, latency, gbps in self.hops(src, dst):
            seconds = _delay(0.0, gbps, nbytes)
            first = self.calendars.book(link, first + latency, seconds)
            end = max(end + latency, first + seconds)
        return end - last

    def ring(self, n: int) -> list[tuple[int, float, float]]:
        """The levels above the hosts of a collective over ranks 0..n−1: (members, latency
        s, bandwidth Gbit/s) of the ring among a region's racks, then among the regions
        (the WAN's slowest link between two of them, its longest latency); members 1 = no
        such level."""
        c = self.cfg
        if not c.rack_size or n <= c.rack_size:
            return []
        racks = math.ceil(n / c.rack_size)
        per_region = min(c.region_size, racks) if c.region_size else racks
        levels = [(per_region, c.rack_latency_ms / 1000, c.rack_bandwidth_gbps)]
        regions = math.ceil(racks / c.region_size) if c.region_size else 1
        if regions > 1:
            pairs = [(g, h) for g in range(regions) for h in range(regions) if g != h]
            limited = [c.wan_bandwidth_gbps[g][h] for g, h in pairs if c.wan_bandwidth_gbps[g][h]]
            slowest = min(limited, default=0.0)  # 0: every pair unlimited
            latency = max(c.wan_latency_ms[g][h] for g, h in pairs) if c.wan_latency_ms else 0
            levels.append((regions, latency / 1000, slowest))
        return levels


class Network:
    """The prices of the cluster's messages and collectives (seconds), from
    `cluster.push_*`/`pull_*`, the number of workers, the transport and its collective
    algorithm (`stalebench.transports`), the hosts and the topology (none: one switch)."""

    def __init__(self, cfg: ClusterConfig, topology: Topology | None = None):
        self.cfg = cfg
        self.topology = topology if topology is not None and not topology.flat else None
        preset = transports.transport(cfg.transport)
        rate = efficiency(cfg)
        self.push_gbps = cfg.push_bandwidth_gbps * rate  # what the NICs' bytes reach
        self.pull_gbps = cfg.pull_bandwidth_gbps * rate
        fixed = cfg.collective_ms if cfg.collective_ms != -1 else preset.collective_ms
        self.collective_s = fixed / 1000
        self.message_ms = cfg.message_ms if cfg.message_ms != -1 else preset.message_ms
        self.pipelined = preset.pipelined if cfg.pipelined is None else cfg.pipelined
        self.algorithm = cfg.collective or preset.collective
        self.gpus = cfg.gpus_per_host
        link = transports.host_link(cfg.host_link) if cfg.host_link else None
        self.link_gbps = cfg.host_link_gbps or (link.gbps if link else 0.0)
        self.link_ms = link.latency_ms if link else 0.0
        # a staging copy through host memory, where the transport needs one and the modelled
        # device is a GPU: its seconds a byte (0: none)
        staged = preset.staging and cfg.device and DEVICES[cfg.device].gpu
        self.stage_s = 8 / (transports.host_link(cfg.staging_link).gbps * 1e9) if staged else 0.0
        self.placement = transports.placement(cfg.ps_placement)
        self.priced: dict[tuple[str, float, float], float] = {}  # collectives' prices, by size
        self.inside = HostLink(self) if self.gpus > 1 else None  # two ranks of one host

    def between(self, src: int, dst: int) -> Network | HostLink:
        """The prices of a message from rank `src` to rank `dst`: this network's, or where
        both sit on one host (`cluster.gpus_per_host`) its link's (`HostLink`)."""
        if self.inside is not None and src // self.gpus == dst // self.gpus:
            return self.inside
        return self

    def leave(self, up: Link, now: float, seconds: float) -> float:
        """When a hub's message sent at `now`, `seconds` on its NIC, starts (`Link.leave`)."""
        return up.leave(now, seconds)

    def take(self, down: Link, arrival: float, seconds: float) -> float:
        """When a message arriving at `arrival`, `seconds` on a NIC's downlink, is through
        it (`Link.take`)."""
        return down.take(arrival, seconds)

    def cross(self, src: int, dst: int, nbytes: float, last: float, nic_s: float) -> float:
        """What the topology's shared links add to a message (`Topology.cross`); 0 without."""
        if self.topology is None:
            return 0.0
        return self.topology.cross(src, dst, nbytes, last, nic_s)

    def push_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of one message from a worker: its latency, the transport's cost a message,
        its bytes at the NIC's effective bandwidth, a staging copy; `slow_s` is what a slow
        fault adds to each message that worker sends (`Faults.slow_s`)."""
        latency = self.cfg.push_latency_ms + self.message_ms
        return _delay(latency, self.push_gbps, nbytes) + nbytes * self.stage_s + slow_s

    def pull_s(self, nbytes: float) -> float:
        latency = self.cfg.pull_latency_ms + self.message_ms
        return _delay(latency, self.pull_gbps, nbytes) + nbytes * self.stage_s

    def hold_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """How long a worker's send holds it (`push_s`): all of it, or, where the transport
        pipelines messages, all but the latency, which the message spends on its way
        (`flight_s`) while the sender goes on."""
        key = ("hold", nbytes, slow_s)  # a price depends on these alone: once each
        if key not in self.priced:
            self.priced[key] = self.push_s(nbytes, slow_s) - self.flight_s()
        return self.priced[key]

    def flight_s(self) -> float:
        """The part of a message's time after its sender let go: its latency where messages
        are pipelined, else none."""
        return self.cfg.push_latency_ms / 1000 if self.pipelined else 0.0

    def push_wire_s(self, nbytes: float) -> float:
        """How long a message to a hub holds the hub's downlink: its bytes at the push
        bandwidth (no latency: that is spent on the way)."""
        return _delay(0.0, self.push_gbps, nbytes)

    def pull_wire_s(self, nbytes: float) -> float:
        """How long a hub's message holds its uplink: its bytes at the pull bandwidth."""
        return _delay(0.0, self.pull_gbps, nbytes)

    def peer_through(self, down: Link, arrival: float, nbytes: float) -> float:
        """When a message between two peers, out of its sender's NIC at `arrival` (its push
        time was its transfer: the bytes reach the receiver as they leave), is through the
        receiver's downlink `down`. It crosses the sender's uplink and the receiver's
        downlink at once, so the slower direction sets its time (the larger latency, the
        smaller bandwidth: a pull direction slower than the push holds it back by the
        difference), and it is through no sooner than the messages before it are."""
        c = self.cfg
        up, wire = self.push_wire_s(nbytes), self.pull_wire_s(nbytes)
        late = max(wire - up, 0.0) + max(c.pull_latency_ms - c.push_latency_ms, 0.0) / 1000
        return down.take(arrival + late, wire)

    def allreduce_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of an all-reduce of `nbytes` over the N workers by the transport's
        algorithm (`stalebench.runtime.collectives`), plus its fixed cost and a staging copy
        each way. A ring is 2(N − 1) steps of a chunk of nbytes/N each, 2(N − 1)·(α +
        nbytes/(N·β)) when both directions have latency α and bandwidth β (N = 1: 0).

        In each step every worker sends a chunk to the next worker (charged the push
        direction's latency and bandwidth) while it receives one from the previous (the pull
        direction's); the step lasts as long as the slower of the two, because the next step
        forwards the chunk just received. A worker whose sends a slow fault delays by `slow_s`
        makes every step that much longer: the next step waits for its chunk.

        Over a topology (`Topology.ring`), hierarchical: the ring above within each rack of
        k hosts (2(k − 1) steps of nbytes/k), then at each level above it 2(m − 1) steps
        among its m groups of h hosts, every host a chunk of nbytes/(m·h) through its NIC,
        all of a group's at once through the group's one link (nbytes/m a step): a step
        lasts the level's latency plus the slower of the NIC's and the link's time.
        """
        key = ("all_reduce", nbytes, slow_s)  # a price depends on these alone: once each
        if key not in self.priced:
            self.priced[key] = self._allreduce_s(nbytes, slow_s)
        return self.priced[key]

    def _allreduce_s(self, nbytes: float, slow_s: float) -> float:
        from stalebench.runtime import collectives

        n = self.cfg.num_workers
        levels = self.topology.ring(n) if self.topology is not None else []
        if not levels:
            seconds = collectives.allreduce_s(self, nbytes, n, slow_s)
        else:
            k = self.cfg.rack_size
            seconds = 2 * (k - 1) * (self._nic_s(nbytes / k) + slow_s)
            hosts = k  # under one group of the level
            for m, latency, gbps in levels:
                step = max(self._nic_s(nbytes / (m * hosts)), _delay(0.0, gbps, nbytes / m))
                seconds += 2 * (m - 1) * (latency + step + slow_s)
                hosts *= m
        return seconds + self.collective_s + 2 * nbytes * self.stage_s

    def allgather_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        """Seconds of an all-gather of one `nbytes` piece from each of the N workers: a ring
        of N − 1 steps, each forwarding one piece (the slower direction, as `allreduce_s`)
        (other algorithms: `stalebench.runtime.collectives`). Over a topology, from the top
        level down: each host swaps what it holds with its counterparts in the other
        groups of a level (the group's link carries its hosts' share at once), then each
        rack's ring forwards the blocks gathered above."""
        key = ("all_gather", nbytes, slow_s)
        if key not in self.priced:
            self.priced[key] = self._allgather_s(nbytes, slow_s)
        return self.priced[key]

    def _allgather_s(self, nbytes: float, slow_s: float) -> float:
        from stalebench.runtime import collectives

        n = self.cfg.num_workers
        levels = self.topology.ring(n) if self.topology is not None else []
        if not levels:
            seconds = collectives.allgather_s(self, nbytes, n, slow_s)
        else:
            k = self.cfg.rack_size
            hosts = [k]  # under one group of each level
            for m, _, _ in levels:
                hosts.append(hosts[-1] * m)
            seconds, held = 0.0, nbytes  # what each host holds, from the top level down
            for (m, latency, gbps), h in reversed(list(zip(levels, hosts, strict=False))):
                step = max(self._nic_s(held), _delay(0.0, gbps, h * held))
                seconds += (m - 1) * (latency + step + slow_s)
                held *= m
            seconds += (k - 1) * (self._nic_s(held) + slow_s)
        return seconds + self.collective_s + 2 * n * nbytes * self.stage_s

    def _nic_s(self, nbytes: float) -> float:
        """A collective step's time on the NICs: the slower direction (no staging copy:
        a collective's is once, `allreduce_s`)."""
        push = _delay(self.cfg.push_latency_ms + self.message_ms, self.push_gbps, nbytes)
        pull = _delay(self.cfg.pull_latency_ms + self.message_ms, self.pull_gbps, nbytes)
        return max(push, pull)

    def link_s(self, nbytes: float) -> float:
        """A step's time between two GPUs of one host (`cluster.host_link`)."""
        return _delay(self.link_ms, self.link_gbps, nbytes)

    def servers(self) -> Sharded | None:
        """Under a sharded parameter server (`collective=sharded_ps`), a round's pieces
        priced at the servers holding them, a piece at a time (`collectives.Sharded`, its
        NICs unbooked); else None (each piece a lone all-reduce, one after another)."""
        if self.algorithm != "sharded_ps":
            return None
        from stalebench.runtime import collectives

        return collectives.Sharded(self)

    def piece_ends(self, sizes, order, ready, slow_s: float = 0.0, spans=None) -> list[float]:
        """When each of a round's pieces (`sizes` bytes, made at `ready` seconds) is summed
        on every rank, all-reduced in `order`: one after another on the rank's link, each
        once made and the one before it through; under a sharded parameter server each
        piece's parts pushed to and pulled from the servers holding them
        (`collectives.sharded_ends`; `spans`: the tensors each piece holds, by default a
        tensor a piece)."""
        if self.algorithm == "sharded_ps":
            from stalebench.runtime import collectives

            return collectives.sharded_ends(self, sizes, order, ready, slow_s, spans)
        end, ends = 0.0, [0.0] * len(sizes)
        for k in order:
            if not sizes[k]:  # nothing of it travels (model-parallel tensors): summed once made
                ends[k] = ready[k]
                continue
            end = max(end, ready[k]) + self.allreduce_s(sizes[k], slow_s)
            ends[k] = end
        return ends

    def priority_order(self, sizes: list[int], ready: list[float]) -> list[int]:
        """The order in which pieces of `sizes` bytes, made at `ready` seconds, go over a
        rank's link as all-reduces under a priority schedule (P3): whenever the link is
        free, the made piece nearest the input (the lowest index) first (a piece holds the
        link its all-reduce's time)."""
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


class HostLink:
    """A message to another GPU of its host: over `cluster.host_link` (its latency and
    bandwidth: `Network.link_s`), never through the host's NIC — no share of line rate, no
    transport cost a message (those are the NIC transport's), no staging copy, no shared
    link, no queue on a NIC (a hub's uplink or downlink, a peer's downlink). A peer's holds
    its sender for all of it (a `slow` fault adding to it as to any message); a hub's is
    paid by its receiver (`pull_s`). The prices `Network` gives a message, under the same
    names."""

    def __init__(self, network: Network):
        self.network = network

    def hold_s(self, nbytes: float, slow_s: float = 0.0) -> float:
        return self.network.link_s(nbytes) + slow_s

    def pull_s(self, nbytes: float) -> float:
        return self.network.link_s(nbytes)

    def flight_s(self) -> float:
        return 0.0

    def push_wire_s(self, nbytes: float) -> float:
        return _delay(0.0, self.network.link_gbps, nbytes)

    pull_wire_s = push_wire_s

    def cross(self, src: int, dst: int, nbytes: float, last: float, nic_s: float) -> float:
        return 0.0

    def peer_through(self, down: Link, arrival: float, nbytes: float) -> float:
        return arrival

    def leave(self, up: Link, now: float, seconds: float) -> float:
        return now

    def take(self, down: Link, arrival: float, seconds: float) -> float:
        return arrival


def efficiency(cfg: ClusterConfig) -> float:
    """The share of line rate the NICs' bytes reach: `cluster.efficiency`, else the
    transport's (checked: one of them is set)."""
    return cfg.efficiency or transports.transport(cfg.transport).efficiency


def _delay(latency_ms: float, bandwidth_gbps: float, nbytes: float) -> float:
    transfer = nbytes * 8 / (bandwidth_gbps * 1e9) if bandwidth_gbps else 0.0
    return latency_ms / 1000.0 + transfer

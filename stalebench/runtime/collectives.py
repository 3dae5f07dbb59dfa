"""The collective algorithms of the network model, each costed on the profile's links
(`Network`: a NIC step `_nic_s(bytes)` = the slower direction's latency, the transport's cost
a message and the bytes at the effective bandwidth; a step between GPUs of one host
`link_s(bytes)`). n ranks fill hosts of g (`cluster.gpus_per_host`), H = ⌈n / g⌉ of them;
every step of an algorithm lasts its slowest transfer, and a NIC carries at once whatever
all its host's ranks send across hosts in that step.

- ring: 2(n − 1) steps of S/n. Ranks of a host are neighbours, so one edge a host crosses
  its NIC each way: a step is max(NIC step(S/n), link step(S/n)).
- recursive_doubling: p = 2^⌊log2 n⌋; the ranks past p first fold into p (one step of S) and
  get the sum back at the end (another); then log2 p exchanges of the whole buffer with the
  rank at distance 1, 2, 4, …: inside a host (distance < g) a link step of S, across hosts
  one of all g ranks at once, a NIC step of g·S.
- tree: a binomial reduce to rank 0, then a binomial broadcast: ⌈log2 n⌉ rounds each, in
  round k one message of S between ranks 2^k apart (inside a host while 2^k < g; across
  hosts at most one rank of a host sends), so 2 Σ_k step(S).
- hierarchical: a ring reduce-scatter inside each host (g − 1 link steps of S/g), a ring
  all-reduce across the H hosts of every rank's shard at once — the host's g shards share
  its NIC, S/H through it a step, their latencies overlapping: 2(H − 1) NIC steps of S/H —
  and a ring all-gather inside the host again (g − 1 link steps of S/g).
- sharded_ps: one key of S bytes on the parameter servers that share the workers' hosts
  (`sharded_ends`): for one buffer, split over the servers where it is larger than the
  placement's bound.

A slow fault's `slow_s` adds to every step (the step waits for the slowed rank's message).
"""

from __future__ import annotations

import bisect
import math


def allreduce_s(net, nbytes: float, n: int, slow_s: float = 0.0) -> float:
    """Seconds of an all-reduce of `nbytes` over `n` ranks by `net.algorithm`, before the
    transport's fixed cost and staging copy (`Network.allreduce_s` adds them)."""
    if n <= 1:
        return 0.0
    g = min(net.gpus, n)
    hosts = math.ceil(n / g)
    algorithm = net.algorithm
    if algorithm == "sharded_ps":
        return max(sharded_ends(net, [nbytes], [0], [0.0], slow_s))  # a tensor, key 0
    if algorithm == "hierarchical" and g > 1:
        inside = 2 * (g - 1) * (net.link_s(nbytes / g) + slow_s)
        return inside + 2 * (hosts - 1) * (net._nic_s(nbytes / hosts) + slow_s)
    if algorithm in ("ring", "hierarchical"):
        chunk = nbytes / n
        step = max(net._nic_s(chunk) if hosts > 1 else 0.0, net.link_s(chunk) if g > 1 else 0.0)
        return 2 * (n - 1) * (step + slow_s)
    if algorithm == "recursive_doubling":
        p = 1 << (n.bit_length() - 1)
        seconds = 0.0
        if n > p:  # the ranks past p fold in and get the sum back: across hosts as a rule
            seconds += 2 * (_across(net, nbytes, min(g, n - p), p, g) + slow_s)
        d = 1
        while d < p:
            seconds += _across(net, nbytes, g, d, g) + slow_s
            d *= 2
        return seconds
    if algorithm == "tree":
        rounds = [1 << k for k in range(math.ceil(math.log2(n)))]
        return 2 * sum(_across(net, nbytes, 1, d, g) + slow_s for d in rounds)
    raise ValueError(f"no such collective: {algorithm!r}")


def _across(net, nbytes: float, senders: int, distance: int, g: int) -> float:
    """One exchange of `nbytes` with the rank `distance` away: between GPUs of a host
    while the distance is under g, else through the NIC, which carries it for `senders`
    of its host's ranks at once."""
    if distance < g:
        return net.link_s(nbytes)
    return net._nic_s(senders * nbytes)


def allgather_s(net, nbytes: float, n: int, slow_s: float = 0.0) -> float:
    """Seconds of an all-gather of one `nbytes` piece from each of `n` ranks by
    `net.algorithm` (a sharded parameter server gathers as a ring), before the fixed cost
    and staging copy. recursive_doubling: log2 n exchanges of what each holds (1, 2, 4, …
    pieces); tree: a binomial gather to rank 0 (round k: 2^k pieces a message), then a
    binomial broadcast of all n; hierarchical: a ring inside each host (g − 1 link steps of
    a piece), a ring across the hosts of each host's g pieces through its NIC (H − 1 NIC
    steps of g pieces), a ring inside again of the other hosts' blocks (g − 1 link steps of
    (H − 1) pieces)."""
    if n <= 1:
        return 0.0
    g = min(net.gpus, n)
    hosts = math.ceil(n / g)
    algorithm = net.algorithm
    if algorithm == "hierarchical" and g > 1:
        inside = (g - 1) * (net.link_s(nbytes) + net.link_s((hosts - 1) * nbytes) + 2 * slow_s)
        return inside + (hosts - 1) * (net._nic_s(g * nbytes) + slow_s)
    if algorithm == "recursive_doubling" and n & (n - 1) == 0:
        rounds = [1 << k for k in range(n.bit_length() - 1)]
        return sum(_across(net, d * nbytes, g, d, g) + slow_s for d in rounds)
    if algorithm == "tree":
        rounds = [1 << k for k in range(math.ceil(math.log2(n)))]
        gather = sum(_across(net, d * nbytes, 1, d, g) + slow_s for d in rounds)
        return gather + sum(_across(net, n * nbytes, 1, d, g) + slow_s for d in rounds)
    step = max(net._nic_s(nbytes) if hosts > 1 else 0.0, net.link_s(nbytes) if g > 1 else 0.0)
    return (n - 1) * (step + slow_s)  # a ring (recursive doubling over n no power of two)


class Busy:
    """The intervals one direction of a NIC is busy (sorted, disjoint): `book(ready, s)`
    takes the first free interval of `s` seconds from `ready` on, whatever order the
    messages are booked in."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def book(self, ready: float, seconds: float) -> float:
        i = bisect.bisect_right(self.ends, ready)  # the first interval ending after `ready`
        start = ready
        while i < len(self.starts) and self.starts[i] < start + seconds:
            start = max(start, self.ends[i])
            i += 1
        self.starts.insert(i, start)
        self.ends.insert(i, start + seconds)
        return start


def sharded_ends(net, sizes, order, ready, slow_s: float = 0.0, spans=None) -> list[float]:
    """When each piece (`sizes[k]` bytes, made at `ready[k]` seconds) is summed on every
    worker, under a parameter server sharded over the N workers' hosts (MXNet's
    `dist_device_sync`). The pieces take the links in `order`, each from when it is made:
    a piece earlier in the order is never held back by a later one, and one made later
    waits for no piece after it (the sender's queue sends by priority what is made: P3's
    ps-lite carries each message's priority; a FIFO order is the order they are made in).

    The piece's elements go to the servers that hold them (`cluster.ps_placement` places
    each tensor's by the tensors the piece holds, `spans`: default a tensor a piece, the
    k-th); every worker pushes its share to each such server and pulls the sum back, one
    message each way (a share on the worker's own host crosses no NIC). A message holds its
    sender's NIC uplink for the transport's cost a message and its bytes at the effective
    bandwidth, plus its latency unless messages are pipelined (then the latency is spent on
    the way, the link free for the next message); it reaches the receiver's downlink a
    latency after it starts and holds it for its bytes (cut-through). A host's NIC carries
    its worker's pushes and its server's replies alike, each direction busy with one
    message at a time (`Busy`). A server replies to every worker once all its pushes of
    the piece are in; a piece is summed once every worker has every share back (a GPU's
    staging copy before its push and after its pull)."""
    sharded, ends = Sharded(net), [0.0] * len(sizes)
    for k in order:
        held = spans[k] if spans is not None else None
        ends[k] = sharded.end(k, sizes[k], ready[k], slow_s, held)
    return ends


class Sharded:
    """`sharded_ends` a piece at a time, in the order they take the links (the real
    runtime's pieces, priced as each is issued): the NICs' bookings of the pieces so far."""

    def __init__(self, net):
        n = net.cfg.num_workers
        self.net, self.n = net, n
        self.up, self.down = [Busy() for _ in range(n)], [Busy() for _ in range(n)]

    def end(self, k: int, nbytes: int, ready: float, slow_s: float = 0.0, held=None) -> float:
        """When piece `k` of `nbytes` bytes, made at `ready`, is summed on every worker
        (`held`: the tensors it holds, `Layout.spans`; default the k-th tensor whole)."""
        net, n, c, up, down = self.net, self.n, self.net.cfg, self.up, self.down
        push_latency, pull_latency = c.push_latency_ms / 1000, c.pull_latency_ms / 1000
        cost, end = net.message_ms / 1000, ready
        held = held if held is not None else [(k, 0, nbytes // 4, nbytes // 4)]
        for server, elements in net.placement.parts(held, n).items():
            size = 4 * elements
            stage = size * net.stage_s
            wire_up, wire_down = size * 8 / _bps(net.push_gbps), size * 8 / _bps(net.pull_gbps)
            summed, pipelined = ready, net.pipelined
            for w in range(n):
                if w != server:
                    pushed = _message(
                        up[w], down[server], ready + stage, wire_up, push_latency, cost, pipelined
                    )
                    summed = max(summed, pushed + slow_s)
            for w in range(n):
                got = summed
                if w != server:
                    got = _message(
                        up[server], down[w], summed, wire_down, pull_latency, cost, pipelined
                    )
                end = max(end, got + stage)
        return end


def _message(up: Busy, down: Busy, ready: float, wire: float, latency: float, cost: float,
             pipelined: bool) -> float:  # fmt: skip
    """When a message sent at `ready` on uplink `up` is through the receiver's downlink."""
    hold = cost + wire + (0.0 if pipelined else latency)
    start = up.book(ready, hold)
    through = down.book(start + cost + latency, wire)
    return max(through + wire, start + cost + wire + latency)


def _bps(gbps: float) -> float:
    return gbps * 1e9 if gbps else math.inf

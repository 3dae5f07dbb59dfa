"""What moves the bytes: transports, collective algorithms, the links inside a host, and
where a sharded parameter server puts its keys — the named presets of a cluster profile's
network (`cluster.transport`, `cluster.collective`, `cluster.host_link`,
`cluster.ps_placement`), each with its source. The network model
(`stalebench.runtime.network`) prices them.

A transport's number that no source pins is `None`: a profile that names the transport
must then give the number itself (`cluster.efficiency`, ...), and says where it comes from;
the model never makes one up. A fixed cost that no source pins is not charged (0), and
the preset's `source` says so.
"""

from __future__ import annotations

import dataclasses

from stalebench.errors import ConfigError

# all-reduce algorithms (`Network.allreduce_s` prices each on the profile's links):
# ring: 2(n − 1) steps of 1/n of the buffer; recursive_doubling: log2(n) exchanges of the
# whole buffer (two more when n is no power of two); tree: a binomial reduce to one rank,
# then a binomial broadcast; hierarchical: a ring inside each host, a ring across the hosts
# (the host's ranks' shards through its one NIC), a ring inside again; sharded_ps: every
# rank pushes each key to the parameter server that holds it and pulls the sum back
COLLECTIVES = ("ring", "recursive_doubling", "tree", "hierarchical", "sharded_ps")


@dataclasses.dataclass(frozen=True)
class Transport:
    name: str
    # the fraction of the NIC's line rate its bytes reach (None: no source pins it)
    efficiency: float | None
    collective_ms: float  # a fixed cost of every collective, however small
    message_ms: float  # a fixed cost of every message (a collective's steps included)
    pipelined: bool  # messages on one connection overlap their latencies
    collective: str  # its all-reduce algorithm
    staging: bool  # a GPU's bytes cross host memory (a copy each way) before the wire
    source: str


TRANSPORTS = {
    t.name: t
    for t in (
        Transport(
            "ideal", 1.0, 0.0, 0.0, False, "ring", False,
            "no transport: every byte at the NIC's line rate, a ring all-reduce, no fixed "
            "cost (the model before transports; the default)",
        ),
        Transport(
            "nccl_ib", None, 0.0, 0.0, True, "ring", False,
            "NCCL over InfiniBand (GPUDirect: no host copy), its ring; no measurement pins "
            "its share of line rate: the one report read (github.com/NVIDIA/nccl-tests/"
            "issues/29: about 6 GB/s bus bandwidth on EDR, 100 Gbit/s) is a complaint that "
            "it is low; no fixed cost charged",
        ),
        Transport(
            "nccl_tcp", 0.60, 1.5, 0.0, True, "ring", True,
            "NCCL over TCP sockets: 'not ... more than 60% of wire speed over 32Gpbs "
            "networks' (github.com/NVIDIA/nccl/issues/209; 32-48 % of 100 Gbit/s in issue "
            "450); a collective of 1-4 KB took 1.46-2.06 ms (NCCL 2.3.7 over sockets, "
            "github.com/pytorch/gloo/issues/158): 1.5 ms fixed; sockets read host memory",
        ),
        Transport(
            "gloo_tcp", 0.21, 0.35, 0.0, False, "ring", True,
            "gloo over TCP: allreduce_ring_chunked of 20 MB at 1.073 GB/s on a 40 GbE NIC, "
            "21 % (github.com/pytorch/gloo/issues/248); a 1 KB all-reduce took 0.354 ms "
            "(github.com/pytorch/gloo/issues/158): 0.35 ms fixed; CUDA tensors are staged "
            "through host memory",
        ),
        Transport(
            "thd_tcp", None, 0.0, 0.0, False, "recursive_doubling", True,
            "PyTorch 0.4-0.5's TCP backend (THD DataChannelTCP::allReduce, pytorch commit "
            "e863d273 on): MPICH's recursive doubling, the whole tensor exchanged log2(p) "
            "times, one step more each way past a power of two; messages of CPU tensors "
            "(a GPU's copied to host memory); no measurement pins its share of line rate",
        ),
        Transport(
            "ps_lite", None, 0.0, 0.0, True, "sharded_ps", True,
            "MXNet's dist kvstore over ps-lite: a push returns without waiting and each "
            "peer has one ZeroMQ DEALER socket, so a connection's messages pipeline "
            "(dmlc/ps-lite src/zmq_van.h); keys pass through pinned host memory "
            "(src/kvstore/kvstore_dist.h); no measurement pins its share of line rate",
        ),
        Transport(
            "mpi", None, 0.0, 0.0, False, "ring", False,
            "MPI: MPICH all-reduces up to 2,048 bytes by recursive doubling, larger ones by "
            "Rabenseifner's reduce-scatter and all-gather, whose bytes are the ring's (src/"
            "mpi/coll/allreduce.c): a ring here; no measurement pins its share of line rate",
        ),
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class HostLink:
    """The link between a host's GPUs (each direction), or between a GPU and host memory."""

    name: str
    gbps: float
    latency_ms: float
    source: str


HOST_LINKS = {
    h.name: h
    for h in (
        HostLink(
            "nvlink2", 600.0, 0.0,
            "NVLink 2.0 on a DGX-1 (V100): 25 GB/s each way a link, the hybrid cube-mesh "
            "'three interwoven rings of single NVLink connections' (DGX-1 V100 system "
            "architecture white paper): a ring of three links, 75 GB/s = 600 Gbit/s",
        ),
        HostLink(
            "pcie3", 96.0, 0.0,
            "PCIe 3.0 x16, a pinned copy: 12.15 GB/s host to device, 12.89 device to host "
            "(CUDA bandwidthTest, P100-PCIe, github.com/mpicbg-scicomp/gearshifft/pull/82; "
            "15.75 GB/s on paper): 12 GB/s = 96 Gbit/s",
        ),
        HostLink(
            "pcie3_pageable", 44.0, 0.0,
            "PCIe 3.0 x16 from pageable memory: 'transfers at 5-6 GB/s, and 11-12 GB/s' "
            "pinned (github.com/rapidsai/dask-cuda/pull/98): 5.5 GB/s = 44 Gbit/s",
        ),
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a sharded parameter server keeps each tensor's elements over S servers: a
    tensor of fewer elements than `bound` whole on server (t × 9973) mod S (t: its key, the
    tensor's index); a larger one either split evenly over every server (`slices` 0), or
    cut into slices of `slices` elements, slice i on server i mod S."""

    name: str
    bound: int
    slices: int
    source: str

    def parts(self, spans, servers: int) -> dict[int, int]:
        """The elements of a piece that each server holds: `spans` are the piece's
        (tensor, first element, end, tensor's elements)."""
        held: dict[int, int] = {}
        for t, lo, hi, numel in spans:
            if numel < self.bound or servers == 1:
                shares = [((t * 9973) % servers, hi - lo)]
            else:
                size = self.slices or -(-numel // servers)  # the evenly split share: ⌈n/S⌉
                shares = [
                    (i % servers, min(hi, (i + 1) * size) - max(lo, i * size))
                    for i in range(lo // size, -(-hi // size))
                ]
            for server, count in shares:
                held[server] = held.get(server, 0) + count
        return held


PLACEMENTS = {
    p.name: p
    for p in (
        Placement(
            "mxnet", 1_000_000, 0,
            "MXNet's KVStoreDist (src/kvstore/kvstore_dist.h, 1.2-1.5): an array under "
            "MXNET_KVSTORE_BIGARRAY_BOUND (1,000,000) elements goes whole to server "
            "(key * 9973) % num_servers, a larger one evenly over all servers",
        ),
        Placement(
            "p3", 40_000, 40_000,
            "P3's KVStoreDist (github.com/anandj91/p3, src/kvstore/kvstore_dist.h): an "
            "array under 40,000 elements (its MXNET_KVSTORE_BIGARRAY_BOUND default) whole to "
            "server (key * 9973) % num_servers, a larger one in slices of 40,000, slice i "
            "on server i % num_servers",
        ),
    )
}  # fmt: skip


def transport(name: str) -> Transport:
    if name not in TRANSPORTS:
        raise ConfigError(f"cluster.transport: unknown {name!r}; known: {', '.join(TRANSPORTS)}")
    return TRANSPORTS[name]


def host_link(name: str) -> HostLink:
    if name not in HOST_LINKS:
        raise ConfigError(f"cluster.host_link: unknown {name!r}; known: {', '.join(HOST_LINKS)}")
    return HOST_LINKS[name]


def placement(name: str) -> Placement:
    if name not in PLACEMENTS:
        known = ", ".join(PLACEMENTS)
        raise ConfigError(f"cluster.ps_placement: unknown {name!r}; known: {known}")
    return PLACEMENTS[name]

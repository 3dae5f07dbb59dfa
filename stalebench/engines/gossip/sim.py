"""The gossip engine in the simulator: every node's gradients computed for real on one shared
model, each node on a virtual clock of its own.

Node i's iteration k starts when its iteration k − 1 ended (and any pause a fault causes),
computes for the profile's step time, then sends: each message to an out-peer leaves after
the profile's push delay for its bytes (one after the other, slowed by the node's `slow`
faults), as `Shaped.isend` sleeps before each send. It ends once the messages due at k
(sent at k − τ by its in-peers) have arrived, each then taking the pull delay, as
`Shaped.recv` sleeps after each receive. It waits for nobody else: a slow node delays its
out-peers only. At the engine's collective every node waits for the last to arrive, then
each all-reduce lasts the profile's ring time.

All nodes' iteration k is computed before any node's k + 1: the messages of k are then all
sent before any is taken in, whatever the clocks say (a message is only ever taken in at a
later or the same iteration, never earlier)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stalebench.engines.gossip.node import (
    Net,
    Node,
    gossip_bytes,
    message_bytes,
    mixing,
    report,
    sync_bytes,
    syncs_at,
)
from stalebench.engines.rounds import ring_volume
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.record import RunRecord, diverged, spent


def simulate(job: Job, run_dir: Path) -> dict[str, Any]:
    cfg, n, profile = job.cfg, job.cfg.cluster.num_workers, job.profile
    torch.set_num_threads(cfg.num_threads)
    record, rule = RunRecord(job, run_dir, flush_s=0.2), mixing(job)
    net = Net(job, job.device(0))
    theta = net.flat.detach().cpu().clone()
    nodes = [Node(job, i, theta, net, rule) for i in range(n)]
    every, budget = cfg.engine.sync_every, cfg.budget.max_updates
    msg_bytes = message_bytes(theta.numel())
    pull_s = profile.pull_s(msg_bytes)  # a message's receive
    z_bytes, stats_bytes = sync_bytes(theta.numel(), n, every)
    clocks, carried = [0.0] * n, [[0.0, 0.0] for _ in range(n)]  # wait, comm of a collective
    sent: dict[tuple[int, int], tuple[torch.Tensor, dict[int, float]]] = {}  # (k, i): msg, at
    rows: list[list[list[float]]] = [[] for _ in range(n)]
    z_mean, k, first, nbytes, status, error = theta.clone(), 0, 0, 0, "completed", None
    loop_start = time.perf_counter()
    record.snapshots.maybe(0.0, 0, theta)

    def iterate(k: int) -> None:
        """Every node's iteration k: gradients and sends, then receives and clocks."""
        grads = []
        for i, node in enumerate(nodes):
            start = node.faults.strike(clocks[i], lambda at, s: None)
            step_s = profile.step_s(i)
            grad, loss = node.gradient(net)
            grads.append(grad)
            if not rule.mixes_first:
                node.step(grad)
            t, arrives, push_s = start + step_s, {}, profile.push_s(msg_bytes, node.faults.slow_s)
            for peer in rule.out_peers(i, k):
                t += push_s
                arrives[peer] = t
            sent[(k, i)] = (node.send(k), arrives)
            wait, comm = carried[i]
            comm += len(arrives) * push_s
            rows[i].append([t, loss, step_s, wait, comm, start - clocks[i], 0])
            carried[i] = [0.0, 0.0]
        for i, node in enumerate(nodes):
            row, t = rows[i][-1], rows[i][-1][0]
            if k >= rule.delay:
                for j in rule.in_peers(i, k - rule.delay):
                    message, arrives = sent[(k - rule.delay, j)]
                    row[3] += max(arrives[i] - t, 0.0)
                    t = max(t, arrives[i]) + pull_s
                    row[4] += pull_s
                    node.receive(message)
                row[6] = rule.delay
            if rule.mixes_first:
                node.step(grads[i])
            row[0] = clocks[i] = t
        for i in range(n):
            sent.pop((k - rule.delay, i), None)

    def meet(version: int) -> bool:
        """The collective after iteration `version` − 1: z̄, the events, the snapshot; True
        when the run is to stop."""
        nonlocal first, nbytes, z_mean, status
        zs = [node.z for node in nodes]
        z_mean = zs[0].clone()
        for z in zs[1:]:
            z_mean += z
        z_mean /= n
        dists = np.array([float((z - z_mean).norm()) for z in zs])
        stop = spent(cfg.budget, version, clocks[0])  # rank 0 decides, at its clock
        done = max(c + profile.allreduce_s(z_bytes, node.faults.slow_s)
                   for c, node in zip(clocks, nodes, strict=True))  # fmt: skip
        done += max(profile.allreduce_s(stats_bytes, node.faults.slow_s) for node in nodes)
        for i, node in enumerate(nodes):
            comm = profile.allreduce_s(z_bytes, node.faults.slow_s)
            comm += profile.allreduce_s(stats_bytes, node.faults.slow_s)
            carried[i] = [done - clocks[i] - comm, comm]
            clocks[i] = done
        nbytes += ring_volume(z_bytes, n) + ring_volume(stats_bytes, n)
        nbytes += gossip_bytes(rule, first, version, theta.numel())
        window = np.array(rows, dtype=np.float64)
        report(record.events.emit, first, window, dists)
        record.snapshots.maybe(done, version, z_mean)
        if any(diverged(loss) for loss in window[:, :, 1].flat) or diverged(0.0, z_mean):
            status, stop = "diverged", True
        first = version
        for r in rows:
            r.clear()
        return stop

    try:
        while True:
            iterate(k)
            k += 1
            if syncs_at(k - 1, every, budget) and meet(k):
                break
    except RunError as exc:  # a fault killed a node: its out-peers wait for it forever
        status, error = "failed", str(exc)
    for kept, mine in zip(net.buffers, nodes[0].buffers, strict=True):
        kept.copy_(mine)  # node 0's BatchNorm statistics, for the evaluation
    return record.finish(
        net.model, z_mean, first, max(clocks), status, error, bytes_sent=nbytes, virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )  # fmt: skip

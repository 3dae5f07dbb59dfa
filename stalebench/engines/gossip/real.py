"""The gossip engine in the real runtime: one process per node, gloo point-to-point messages
between peers, the cluster profile paid by the transport (its network) and by each step
(step time, faults). Rank 0 writes the run directory.

A node sends without waiting (isend) and blocks, with the run's timeout, only for the
messages due at its iteration; a send's buffer is kept until gloo says it is delivered,
which the receiver allows within τ + 1 iterations. At the engine's collective every node
meets: one all-reduce of z (z̄, snapshotted by rank 0), one of the statistics (rank 0
writes the window's events from them) with rank 0's stop decision and each node's
divergence, so that every rank stops after the same iteration. A dead peer ends the run:
its out-peers' receives and the next collective fail, naming whom they lost.
"""

from __future__ import annotations

import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.gossip.node import (
    ROW,
    Net,
    Node,
    gossip_bytes,
    message_bytes,
    mixing,
    report,
    stats_slots,
    sync_bytes,
    syncs_at,
)
from stalebench.engines.rounds import ring_volume
from stalebench.job import Job
from stalebench.runtime.faults import Shaped, WorkerDied, pad_to
from stalebench.runtime.record import RunRecord, diverged, gradient, spent
from stalebench.runtime.transport import Transport


def run(job: Job, rank: int, run_dir: Path, transport: Transport) -> dict[str, Any] | None:
    return Peer(job, rank, run_dir, transport).run()


class Peer:
    """One rank: its node, its sends in flight, and its statistics since the last meeting."""

    def __init__(self, job: Job, rank: int, run_dir: Path, transport: Transport):
        cfg = job.cfg
        self.job, self.rank, self.n, self.rule = job, rank, cfg.cluster.num_workers, mixing(job)
        self.net = Net(job, job.device(rank))
        theta = self.net.flat.detach().cpu().clone()  # θ₀, the same in every process
        self.node = Node(job, rank, theta, self.net, self.rule)
        self.network = Shaped(transport, job.profile, self.node.faults)
        self.record = RunRecord(job, run_dir) if rank == 0 else None
        self.every, self.d = cfg.engine.sync_every, theta.numel()
        self.msg_bytes = message_bytes(self.d)
        self.z_mean, self.first, self.nbytes, self.status = theta.clone(), 0, 0, "completed"
        self.in_flight: deque[tuple[int, torch.Tensor, list[tuple[Any, int]]]] = deque()
        self.rows: list[list[float]] = []
        self.carried = [0.0, 0.0]  # wait, comm of the last collective, for the next row

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> dict[str, Any] | None:
        net, error, k = self.net, None, 0
        x, y = self.job.splits.x_train[:1], self.job.splits.y_train[:1]
        gradient(net.model, net.params, (x, y), net.device)  # warm-up, off the clock
        self.network.barrier()
        self.t0 = time.perf_counter()
        try:
            while True:
                self.iterate(k)
                k += 1
                if syncs_at(k - 1, self.every, self.job.cfg.budget.max_updates) and self.meet(k):
                    break
            self.drain(k)
        except WorkerDied:
            raise  # its process exits; its out-peers and the next collective lose it
        except Exception as exc:
            self.status, error = "failed", str(exc)
            if self.record is None:
                raise
        if self.record is None:
            return None
        for kept, mine in zip(net.buffers, self.node.buffers, strict=True):
            kept.copy_(mine)  # rank 0's BatchNorm statistics, for the evaluation
        return self.record.finish(
            net.model, self.z_mean, self.first, self.now(), self.status, error,
            bytes_sent=self.nbytes,
        )  # fmt: skip

    def iterate(self, k: int) -> None:
        """Iteration k: the gradient at z, the local step and the gossip, in the rule's order."""
        node, rule, profile = self.node, self.rule, self.job.profile
        now = self.now()
        paused = node.faults.strike(now, lambda at, s: time.sleep(s)) - now
        start = time.perf_counter()
        grad, loss = node.gradient(self.net)
        pad_to(start, profile.step_s(self.rank))
        compute = time.perf_counter() - start
        if not rule.mixes_first:
            node.step(grad)
        message, sends = node.send(k), []
        for peer in rule.out_peers(self.rank, k):
            sends.append((self.network.isend(message, peer), peer))
        self.in_flight.append((k, message, sends))
        self.settle(k - rule.delay)
        wait, comm = self.carried
        comm += len(sends) * profile.push_s(self.msg_bytes, node.faults.slow_s)
        took = k >= rule.delay
        if took:
            waited, pulled = self.take_in(k - rule.delay)
            wait, comm = wait + waited, comm + pulled
        if rule.mixes_first:
            node.step(grad)
        self.rows.append([self.now(), loss, compute, wait, comm, paused, rule.delay * took])
        self.carried = [0.0, 0.0]

    def take_in(self, sent_at: int) -> tuple[float, float]:
        """Receive and add the messages the in-peers sent at iteration `sent_at`; returns the
        seconds waited for them and the seconds the profile's pull delays took."""
        pull_s, waited = self.job.profile.pull_s(self.msg_bytes), 0.0
        for peer in self.rule.in_peers(self.rank, sent_at):
            buf, start = torch.empty(self.d + 1), time.perf_counter()
            self.network.recv(buf, peer)
            waited += max(time.perf_counter() - start - pull_s, 0.0)
            self.node.receive(buf)
        return waited, pull_s * len(self.rule.in_peers(self.rank, sent_at))

    def settle(self, upto: int) -> None:
        """Wait for the sends of iterations before `upto` (their receivers take them in by
        now) and let their buffers go."""
        while self.in_flight and self.in_flight[0][0] < upto:
            _, _, sends = self.in_flight.popleft()
            for work, peer in sends:
                self.network.wait(work, peer)

    def drain(self, k: int) -> None:
        """After the last iteration k − 1: the messages still in flight (τ > 0) are received
        and dropped, so that every send completes."""
        for sent_at in range(max(k - self.rule.delay, 0), k):
            for peer in self.rule.in_peers(self.rank, sent_at):
                self.network.recv(torch.empty(self.d + 1), peer)
        self.settle(k)

    def meet(self, version: int) -> bool:
        """The collective after iteration `version` − 1 (every rank calls it there): z̄, the
        statistics; rank 0 writes the events and the snapshot. True when the run stops."""
        n, profile, slow_s = self.n, self.job.profile, self.node.faults.slow_s
        z_bytes, stats_bytes = sync_bytes(self.d, n, self.every)
        start, t_enter, z = time.perf_counter(), self.now(), self.node.z
        self.network.all_reduce(self.z_mean.copy_(z))
        self.z_mean /= n
        stats = torch.zeros(stats_slots(n, self.every), dtype=torch.float64)
        width = self.every * len(ROW)
        mine = torch.tensor(self.rows, dtype=torch.float64).flatten()
        stats[self.rank * width : self.rank * width + mine.numel()] = mine
        stats[n * width + self.rank] = float((z - self.z_mean).norm())
        losses = [row[1] for row in self.rows]
        stats[-1] = float(any(not math.isfinite(v) for v in losses) or diverged(0.0, z))
        if self.rank == 0:
            stats[-2] = float(spent(self.job.cfg.budget, version, t_enter))
        self.network.all_reduce(stats)
        comm = profile.allreduce_s(z_bytes, slow_s) + profile.allreduce_s(stats_bytes, slow_s)
        self.carried = [max(time.perf_counter() - start - comm, 0.0), comm]
        self.nbytes += ring_volume(z_bytes, n) + ring_volume(stats_bytes, n)
        self.nbytes += gossip_bytes(self.rule, self.first, version, self.d)
        if self.record is not None:
            m = len(self.rows)
            rows = stats[: n * width].view(n, self.every, len(ROW))[:, :m].numpy()
            report(self.record.events.emit, self.first, rows, stats[n * width : -2].numpy())
            self.record.snapshots.maybe(self.now(), version, self.z_mean)
            if stats[-1] > 0:
                self.status = "diverged"
        self.first, self.rows = version, []
        return bool(stats[-2] > 0 or stats[-1] > 0)

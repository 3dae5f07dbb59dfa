"""The local engine in the real runtime: one process per worker, the cluster profile paid by
the transport (its network) and by each inner step (step time, faults). Rank 0 writes the
run directory.

Step by step, as `Plan` says: a fragment's send starts its all-reduce (the payload with
the statistics behind it; where the payload is not float32, or the rule needs the losses
first, the statistics go first in one of their own), and its merge waits for it and
applies the outer step. In sync mode the merge follows the send at once; with a delay the
all-reduce runs while the inner steps go on.

Every rank decides to stop from what all ranks share after a merge (the outer steps, the
losses, θ, and rank 0's clock, which travels in the statistics' last slot), so all stop
after the same merge without a further message.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.common import Net
from stalebench.engines.local.round import (
    STATS,
    Exchange,
    Plan,
    Replica,
    Wire,
    report,
    segments,
    stats_row,
    stats_slots,
)
from stalebench.job import Job
from stalebench.runtime.faults import Shaped, WorkerDied, pad_to
from stalebench.runtime.record import RunRecord, diverged, gradient, spent
from stalebench.runtime.transport import Pending, Transport


@dataclasses.dataclass
class Sent:
    """A fragment's all-reduce under way: its buffers, this worker's Δ and when it started."""

    payload: torch.Tensor | list[torch.Tensor]  # the sum, or (int8) every worker's piece
    stats: torch.Tensor
    delta: torch.Tensor
    pending: list[Pending]
    sync_s: float  # seconds the send itself blocked (a leaders exchange runs in full)
    steps: int


def worker(job: Job, rank: int, run_dir: Path, transport: Transport) -> dict[str, Any] | None:
    return Worker(job, rank, run_dir, transport).run()


class Worker:
    """One rank: its replica, θ (the same on every rank), the fragments' exchanges, and the
    all-reduces under way."""

    def __init__(self, job: Job, rank: int, run_dir: Path, transport: Transport):
        cfg, e = job.cfg, job.cfg.engine
        self.job, self.rank, self.m, self.e = job, rank, job.num_workers, e
        self.net = Net(job, job.device(rank))
        self.theta = self.net.flat.detach().cpu().clone()  # θ₀, the same in every process
        self.rep = Replica(job, rank, self.theta, self.net)
        steps = cfg.algorithm.outer.inner_steps
        self.plan = Plan(e.mode, steps, e.fragments, e.delay, self.theta.numel())
        self.parts = [self.plan.part(p) for p in range(self.plan.fragments)]
        sizes = [p.numel() for p in self.net.params]
        self.exs = [
            Exchange(job, self.theta[part], Wire(e.quantize, segments(sizes, part)))
            for part in self.parts
        ]
        self.network = Shaped(transport, job.profile, self.rep.faults)
        self.record = RunRecord(job, run_dir) if rank == 0 else None
        self.status, self.version, self.nbytes = "completed", 0, 0
        self.sent: dict[int, Sent] = {}
        self.compute, self.paused, self.losses = 0.0, 0.0, []  # since the last send

    def run(self) -> dict[str, Any] | None:
        job, net, rep, plan, error = self.job, self.net, self.rep, self.plan, None
        gradient(
            net.model, net.params, (job.splits.x_train[:1], job.splits.y_train[:1]), net.device
        )
        self.network.barrier()
        self.t0, step, stop = time.perf_counter(), 0, False
        try:
            while self.status == "completed" and not stop:
                if step % plan.steps == 0:
                    rep.inner.new_round()
                now = time.perf_counter() - self.t0
                self.paused += rep.faults.strike(now, lambda at, s: time.sleep(s)) - now
                start, target_s = time.perf_counter(), job.profile.step_s(self.rank)
                self.losses.append(rep.step(net))
                pad_to(start, target_s)
                self.compute += time.perf_counter() - start
                step += 1
                if plan.delay == 0:  # a merge follows its send at once
                    self.send(plan.sends(step))
                stop = any([self.merge(p) for p in plan.merges(step)])
                if plan.delay > 0 and not stop:  # earlier sends merged first, then this step's
                    self.send(plan.sends(step))
            for s in self.sent.values():  # started by every rank: finish them before leaving
                for pending in s.pending:
                    pending.wait()
        except WorkerDied:
            raise  # its process exits; the others lose it in the next all-reduce
        except Exception as exc:
            self.status, error = "failed", str(exc)
            if self.record is None:
                raise
        if self.record is None:
            return None
        for kept, last in zip(net.buffers, rep.buffers, strict=True):
            kept.copy_(last)  # rank 0's BatchNorm statistics, for the evaluation
        t_end = time.perf_counter() - self.t0
        return self.record.finish(
            net.model, self.theta, self.version, t_end, self.status, error,
            bytes_sent=self.nbytes,
        )  # fmt: skip

    def send(self, fragments: list[int]) -> None:
        """Start the all-reduces of `fragments`, with the statistics since the last send."""
        m, rank = self.m, self.rank
        for p in fragments:
            delta = self.theta[self.parts[p]] - self.rep.x[self.parts[p]]
            stats = torch.zeros(stats_slots(m))
            loss = statistics.fmean(self.losses)
            row = stats_row(self.compute, loss, self.paused, delta, self.exs[p].wire)
            stats[STATS * rank : STATS * (rank + 1)] = torch.tensor(row)
            stats[-1] = time.perf_counter() - self.t0 if rank == 0 else 0.0
            self.sent[p] = send(self.network, self.exs[p], rank, delta, stats, len(self.losses))
            self.compute, self.paused, self.losses = 0.0, 0.0, []

    def merge(self, p: int) -> bool:
        """Wait for fragment p's all-reduce and apply it; True when the run is to stop."""
        s, ex, part, theta, m = self.sent.pop(p), self.exs[p], self.parts[p], self.theta, self.m
        wait_start = time.perf_counter()
        for pending in s.pending:
            pending.wait()
        blocked = time.perf_counter() - wait_start + s.sync_s
        rows = s.stats[:-1].view(m, STATS)
        before = theta[part].clone() if self.plan.keeps_progress else None
        leaders = ex.new_theta(theta[part], s.payload)
        ex.merge(self.rep.x[part], s.delta, theta[part], leaders, self.rank, before, self.e.alpha)
        self.version += 1
        volume = ex.volume()
        self.nbytes += volume
        if self.record is not None:
            t = time.perf_counter() - self.t0
            busy = rows[:, 0] + rows[:, 2]
            comm = max(blocked - (float(busy.max()) - float(busy[0])), 0.0)
            emit = self.record.events.emit
            report(emit, t, self.version, rows.tolist(), comm, s.steps, volume // m)
            self.record.snapshots.maybe(t, self.version, theta)
        if diverged(float(rows[:, 1].sum()), theta):
            self.status = "diverged"
        return spent(self.job.cfg.budget, self.version, float(s.stats[-1]))


def send(
    network: Shaped, ex: Exchange, rank: int, delta: torch.Tensor, stats: torch.Tensor,
    steps: int,
) -> Sent:  # fmt: skip
    """Start a fragment's all-reduces. A rule that follows leaders learns the losses first
    (so its statistics are reduced at once; it runs in sync mode only)."""
    start = time.perf_counter()
    if ex.fused:  # one all-reduce: the payload, the statistics behind it
        buf = torch.cat([ex.contribution(rank, delta), stats])
        pending = [network.all_reduce_start(buf)]
        return Sent(buf[: ex.d], buf[ex.d :], delta, pending, 0.0, steps)
    if ex.rule.exchange == "leaders":
        network.all_reduce(stats)
        ex.choose(stats[:-1].view(-1, STATS)[:, 1].tolist())
        payload = ex.contribution(rank, delta)
        network.all_reduce(payload)
        return Sent(payload, stats, delta, [], time.perf_counter() - start, steps)
    payload = ex.contribution(rank, delta)
    pending = [network.all_reduce_start(stats)]
    if ex.gathers:  # int8: every worker's piece, summed after decoding
        pieces = [torch.empty_like(payload) for _ in range(ex.num_workers)]
        pending.append(network.all_gather_start(pieces, payload))
        return Sent(pieces, stats, delta, pending, 0.0, steps)
    pending.append(network.all_reduce_start(payload))
    return Sent(payload, stats, delta, pending, 0.0, steps)

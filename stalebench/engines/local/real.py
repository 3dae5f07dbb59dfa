"""The local engine in the real runtime: one process per worker, one gloo all-reduce per
round (two where the payload is not float32 or the rule needs the losses first: the
statistics, then the payload), the cluster profile paid by the transport (its
network), by each inner step (step time, faults). Rank 0 writes the run directory.

Every rank decides to stop from what all ranks share after a round (the round count, the
losses, θ, and rank 0's clock, which travels in the statistics' last slot), so all stop
after the same round without a further message.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.local.round import (
    STATS,
    Exchange,
    Net,
    Replica,
    Wire,
    report,
    ring_volume,
    stats_row,
    stats_slots,
)
from stalebench.job import Job
from stalebench.runtime.faults import Shaped, WorkerDied, pad_to
from stalebench.runtime.record import RunRecord, diverged, gradient, spent
from stalebench.runtime.transport import Transport


def worker(job: Job, rank: int, run_dir: Path, transport: Transport) -> dict[str, Any] | None:
    cfg, m = job.cfg, job.cfg.cluster.num_workers
    net = Net(job, job.device(rank))
    theta = net.flat.detach().cpu().clone()  # θ₀, the same in every process
    rep, wire = Replica(job, rank, theta, net), Wire(cfg.engine.quantize)
    ex, steps = Exchange(job, theta, wire), cfg.algorithm.outer.inner_steps
    network = Shaped(transport, job.profile)
    record = RunRecord(job, run_dir) if rank == 0 else None
    status, error, version, nbytes = "completed", None, 0, 0
    gradient(net.model, net.params, (job.splits.x_train[:1], job.splits.y_train[:1]), net.device)
    network.barrier()
    t0 = time.perf_counter()
    try:
        while status == "completed":
            compute, paused, losses = 0.0, 0.0, []
            rep.inner.new_round()
            for _ in range(steps):
                now = time.perf_counter() - t0
                paused += rep.faults.strike(now, lambda at, s: time.sleep(s)) - now
                start, target_s = time.perf_counter(), job.profile.step_s(rank)
                losses.append(rep.step(net))
                pad_to(start, target_s)
                compute += time.perf_counter() - start
            delta = theta - rep.x
            stats = torch.zeros(stats_slots(m))
            row = stats_row(compute, statistics.fmean(losses), paused, delta, wire)
            stats[STATS * rank : STATS * (rank + 1)] = torch.tensor(row)
            stats[-1] = time.perf_counter() - t0 if rank == 0 else 0.0
            reduce_start = time.perf_counter()
            if ex.fused:  # one all-reduce: the payload, the statistics behind it
                buf = torch.cat([ex.contribution(rank, delta), stats])
                network.all_reduce(buf)
                payload, stats = buf[: ex.d], buf[ex.d :]
            else:
                network.all_reduce(stats)
                ex.choose(stats[:-1].view(m, STATS)[:, 1].tolist())
                payload = ex.contribution(rank, delta)
                network.all_reduce(payload)
            reduce_s = time.perf_counter() - reduce_start
            rows = stats[:-1].view(m, STATS)
            leaders = ex.new_theta(theta, payload)
            ex.new_replica(rep.x, delta, theta, leaders, rank)
            version += 1
            volume = ring_volume(ex.stats_bytes + ex.payload_bytes, m)
            nbytes += volume
            if record is not None:
                t = time.perf_counter() - t0
                busy = rows[:, 0] + rows[:, 2]
                own = float(busy[0])
                comm = max(reduce_s - (float(busy.max()) - own), 0.0)
                report(record.events.emit, t, version, rows.tolist(), comm, steps, volume // m)
                record.snapshots.maybe(t, version, theta)
            if diverged(float(rows[:, 1].sum()), theta):
                status = "diverged"
            elif spent(cfg.budget, version, float(stats[-1])):
                break
    except WorkerDied:
        raise  # its process exits; the others lose it in the next all-reduce
    except Exception as exc:
        status, error = "failed", str(exc)
        if record is None:
            raise
    if record is None:
        return None
    for kept, last in zip(net.buffers, rep.buffers, strict=True):
        kept.copy_(last)  # rank 0's BatchNorm statistics, for the evaluation
    return record.finish(
        net.model, theta, version, time.perf_counter() - t0, status, error, bytes_sent=nbytes
    )

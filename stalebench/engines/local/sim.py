"""The local engine in the simulator: every worker's inner steps computed for real on one
shared model, on a virtual clock. A round lasts as long as its slowest worker (its steps
at the profile's step times, plus any pause a fault causes), then its all-reduces at
the profile's ring all-reduce time; the payload is summed in the wire's type, worker by
worker, as the real all-reduce sums it (in another order: the two agree to rounding)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from stalebench.engines.local.round import (
    Exchange,
    Net,
    Replica,
    Wire,
    report,
    ring_volume,
    stats_row,
)
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.record import RunRecord, diverged, spent


def simulate(job: Job, run_dir: Path) -> dict[str, Any]:
    import torch

    cfg, m, profile = job.cfg, job.cfg.cluster.num_workers, job.profile
    torch.set_num_threads(cfg.num_threads)
    record = RunRecord(job, run_dir, flush_s=0.2)
    net = Net(job, job.device(0))
    theta = net.flat.detach().cpu().clone()
    reps = [Replica(job, w, theta, net) for w in range(m)]
    wire = Wire(cfg.engine.quantize)
    ex, steps = Exchange(job, theta, wire), cfg.algorithm.outer.inner_steps
    comm_s = ex.comm_s(profile)
    volume = ring_volume(ex.stats_bytes + ex.payload_bytes, m)
    t, version, status, error = 0.0, 0, "completed", None
    loop_start = time.perf_counter()  # the simulator's own speed, for summary.json
    try:
        while status == "completed":
            rows, deltas = [], []
            for rep in reps:
                compute, paused, losses, now = 0.0, 0.0, [], t
                rep.inner.new_round()
                for _ in range(steps):
                    start = rep.faults.strike(now, lambda at, s: None)
                    step_s = profile.step_s(rep.worker)
                    losses.append(rep.step(net))
                    paused, compute, now = paused + start - now, compute + step_s, start + step_s
                deltas.append(theta - rep.x)
                rows.append(stats_row(compute, statistics.fmean(losses), paused, deltas[-1], wire))
            ex.choose([r[1] for r in rows])
            total = ex.contribution(0, deltas[0]).clone()
            for w in range(1, m):
                total += ex.contribution(w, deltas[w])
            leaders = ex.new_theta(theta, total)
            for rep, delta in zip(reps, deltas, strict=True):
                ex.new_replica(rep.x, delta, theta, leaders, rep.worker)
            t += max(r[0] + r[2] for r in rows) + comm_s
            version += 1
            report(record.events.emit, t, version, rows, comm_s, steps, volume // m)
            record.snapshots.maybe(t, version, theta)
            if diverged(sum(r[1] for r in rows), theta):
                status = "diverged"
            elif spent(cfg.budget, version, t):
                break
    except RunError as exc:  # a fault killed a worker: the round it was in never ends
        status, error = "failed", str(exc)
    for kept, last in zip(net.buffers, reps[0].buffers, strict=True):
        kept.copy_(last)  # worker 0's BatchNorm statistics, for the evaluation
    return record.finish(
        net.model, theta, version, t, status, error,
        bytes_sent=version * volume, virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )  # fmt: skip

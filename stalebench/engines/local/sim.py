"""The local engine in the simulator: every worker's inner steps computed for real on one
shared model, each worker on a virtual clock of its own, advanced by the profile's step
times and any pause a fault causes.

A fragment's all-reduce starts when the last worker sends it and lasts the profile's ring
all-reduce time for its bytes; a worker that reaches the merge before it ends waits for
it. In sync mode the merge follows the send, so a round lasts as long as its slowest
worker plus the all-reduce. The payload is summed in the wire's type, worker by worker,
as the real all-reduce sums it (in another order: the two agree to rounding)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.common import Net
from stalebench.engines.local.round import (
    HEADER,
    Arrivals,
    Exchange,
    Plan,
    Replica,
    Wire,
    async_event,
    reply_bytes,
    report,
    segments,
    stats_row,
)
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.clock import EventQueue
from stalebench.runtime.faults import WorkerDied
from stalebench.runtime.record import RunRecord, diverged, spent


@dataclasses.dataclass
class Sent:
    total: torch.Tensor | list[torch.Tensor]  # the summed payload, or (int8) every piece
    deltas: list[torch.Tensor]
    rows: list[list[float]]
    done: float  # when the all-reduce ends
    steps: int
    comm_s: float  # how long it took (a slow fault on any worker slows the ring)


def setup(job: Job, run_dir: Path):
    """The run record, the one model every worker's steps are computed on, θ₀ and the
    replicas."""
    torch.set_num_threads(job.cfg.num_threads)
    record = RunRecord(job, run_dir, flush_s=0.2)
    net = Net(job, job.device(0))
    theta = net.flat.detach().cpu().clone()
    return record, net, theta, [Replica(job, w, theta, net) for w in range(job.num_workers)]


def simulate(job: Job, run_dir: Path) -> dict[str, Any]:
    cfg, m, profile, e = job.cfg, job.num_workers, job.profile, job.cfg.engine
    record, net, theta, reps = setup(job, run_dir)
    plan = Plan(e.mode, cfg.algorithm.outer.inner_steps, e.fragments, e.delay, theta.numel())
    parts = [plan.part(p) for p in range(plan.fragments)]
    sizes = [p.numel() for p in net.params]
    exs = [Exchange(job, theta[part], Wire(e.quantize, segments(sizes, part))) for part in parts]
    clocks, busy = [0.0] * m, [[0.0, 0.0, []] for _ in range(m)]  # compute, paused, losses
    sent: dict[int, Sent] = {}
    version, step, nbytes, status, error = 0, 0, 0, "completed", None
    loop_start = time.perf_counter()  # the simulator's own speed, for summary.json
    record.snapshots.maybe(0.0, 0, theta)

    def sends(step: int) -> None:
        for p in plan.sends(step):
            ex, part = exs[p], parts[p]
            deltas = [theta[part] - rep.x[part] for rep in reps]
            rows = [
                stats_row(c, statistics.fmean(ls), pz, d, ex.wire)
                for (c, pz, ls), d in zip(busy, deltas, strict=True)
            ]
            ex.choose([r[1] for r in rows])
            if ex.gathers:  # int8: every worker's piece, summed after decoding
                total = [ex.contribution(w, deltas[w]) for w in range(m)]
            else:
                total = ex.contribution(0, deltas[0]).clone()
                for w in range(1, m):
                    total += ex.contribution(w, deltas[w])
            comm_s = ex.comm_s(profile, max(rep.faults.slow_s for rep in reps))
            sent[p] = Sent(total, deltas, rows, max(clocks) + comm_s, len(busy[0][2]), comm_s)
            for b in busy:
                b[:] = [0.0, 0.0, []]

    try:
        while status == "completed":
            if step % plan.steps == 0:
                for rep in reps:
                    rep.inner.new_round()
            for w, rep in enumerate(reps):
                start = rep.faults.strike(clocks[w], lambda at, s: None)
                step_s = profile.step_s(w)
                busy[w][2].append(rep.step(net))
                busy[w][0] += step_s
                busy[w][1] += start - clocks[w]
                clocks[w] = start + step_s
            step += 1
            if plan.delay == 0:
                sends(step)
            stop = False
            for p in plan.merges(step):
                s, ex, part = sent.pop(p), exs[p], parts[p]
                before = theta[part].clone() if plan.keeps_progress else None
                leaders = ex.new_theta(theta[part], s.total)
                for w, rep in enumerate(reps):
                    ex.merge(rep.x[part], s.deltas[w], theta[part], leaders, w, before, e.alpha)
                    clocks[w] = max(clocks[w], s.done)
                version += 1
                volume = ex.volume()
                nbytes += volume
                t = max(clocks)
                report(record.events.emit, t, version, s.rows, s.comm_s, s.steps, volume // m)
                record.snapshots.maybe(t, version, theta)
                if diverged(sum(r[1] for r in s.rows), theta):
                    status = "diverged"
                stop = stop or spent(cfg.budget, version, t)
            if stop:
                break
            if plan.delay > 0:
                sends(step)
    except RunError as exc:  # a fault killed a worker: the round it was in never ends
        status, error = "failed", str(exc)
    for kept, last in zip(net.buffers, reps[0].buffers, strict=True):
        kept.copy_(last)  # worker 0's BatchNorm statistics, for the evaluation
    return record.finish(
        net.model, theta, version, max(clocks), status, error,
        bytes_sent=nbytes, virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )  # fmt: skip


def simulate_async(job: Job, run_dir: Path) -> dict[str, Any]:
    """engine.mode=async on the virtual clock: a worker's round (its H steps at the profile's
    step times, and pauses) is computed when it receives θ, and its Δ arrives at the server
    the push delay after; arrivals are applied in time order (ties: in scheduling order)."""
    cfg, m, profile, e = job.cfg, job.num_workers, job.profile, job.cfg.engine
    record, net, theta, reps = setup(job, run_dir)
    server = Arrivals(job, theta)
    wire = Wire(e.quantize, segments([p.numel() for p in net.params], slice(0, theta.numel())))
    push_bytes, pull_bytes = 4 * HEADER + wire.nbytes(theta.numel()), reply_bytes(theta.numel())
    pull_s = profile.pull_s(pull_bytes)
    queue, rounds, t, status, error = EventQueue(), [0] * m, 0.0, "completed", None
    loop_start = time.perf_counter()

    def start(w: int, at: float, steps: int) -> None:
        """Worker w got θ at `at`: its round, then its push on the queue."""
        rep, read, now, compute, paused, losses = reps[w], theta.clone(), at, 0.0, 0.0, []
        rep.inner.new_round()
        for _ in range(steps):
            try:
                begin = rep.faults.strike(now, lambda at, s: None)
            except WorkerDied as died:  # the server learns of it at that time
                queue.push(died.at_s, died)
                return
            step_s = profile.step_s(w)
            losses.append(rep.step(net))
            paused, compute, now = paused + begin - now, compute + step_s, begin + step_s
        delta = wire.decode(wire.encode(read - rep.x))
        stats = [compute, statistics.fmean(losses), paused, float((read - rep.x).norm())]
        stats.append(wire.error(read - rep.x))
        push_s = profile.push_s(push_bytes, rep.faults.slow_s)
        queue.push(now + push_s, (w, delta, server.version, steps, stats, read - rep.x, push_s))

    lost = 0
    record.snapshots.maybe(0.0, 0, theta)
    try:
        for w in range(m):
            start(w, pull_s, server.steps)
        while queue:
            t_next, item = queue.pop()
            if cfg.budget.max_wall_s and t_next > cfg.budget.max_wall_s:
                t = cfg.budget.max_wall_s  # the budget ends before this push arrives
                break
            t = t_next
            if isinstance(item, WorkerDied):  # nobody waits for it: the others go on
                lost += 1
                record.worker_lost(t, item, lost)
                continue
            w, delta, read, steps, stats, own, push_s = item
            lag = server.apply(w, delta, read, steps, stats[0])
            rounds[w] += 1
            if stats[2] > 0:
                record.events.emit("worker", t, worker=w, event="pause", duration_s=stats[2])
            record.events.emit(
                "update", t, **async_event(w, rounds[w] - 1, server.version, lag, stats, steps,
                                           push_s + pull_s, push_bytes + pull_bytes),
            )  # fmt: skip
            record.snapshots.maybe(t, server.version, theta)
            if diverged(stats[1], theta):
                status = "diverged"
                break
            if spent(cfg.budget, server.version, t):
                break
            server.replica(reps[w].x, own)
            start(w, t + pull_s, server.next_steps(w))
    except RunError as exc:  # a fault killed a worker
        status, error = "failed", str(exc)
    for kept, last in zip(net.buffers, reps[0].buffers, strict=True):
        kept.copy_(last)
    return record.finish(
        net.model, theta, server.version, t, status, error,
        bytes_sent=server.version * (push_bytes + pull_bytes), virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )  # fmt: skip

"""The pipeline in the simulator: the same `Stage` calls as the real pipeline, in one
process in microbatch order (docs/algorithms.md §10.7), each stage forwarding at the
version its schedule gives it; virtual time comes from a replay of the schedule with
per-op costs from cluster.compute_ms."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.pipeline.run import (
    build_stages,
    microbatches,
    snapshot_due,
    summary_extra,
    update_event,
)
from stalebench.engines.pipeline.stage import Stage, Timeline
from stalebench.job import Job
from stalebench.runtime.record import RunRecord, spent


def simulate(job: Job, run_dir: Path) -> dict[str, Any]:
    cfg = job.cfg
    torch.set_num_threads(cfg.num_threads)
    pipe, budget = cfg.algorithm.pipeline, cfg.budget
    record = RunRecord(job, run_dir, flush_s=0.2)
    model, modules = build_stages(job)
    cpu = torch.device("cpu")
    stages = [Stage(k, mod, pipe, cfg.algorithm.optimizer, cpu) for k, mod in enumerate(modules)]
    per = pipe.per_step
    cost = cfg.cluster.compute_ms / 1000 / per  # one microbatch's forward + backward, a stage
    clock = Timeline(pipe, cost / 3, 2 * cost / 3)
    stream = microbatches(job)
    status, t, step, loop_start = "completed", 0.0, 0, time.perf_counter()
    record.snapshots.take(0.0, 0, torch.cat([s.w for s in stages]))
    while not spent(budget, step, t):
        t_next = clock.update_time(0, step)
        if budget.max_wall_s and t_next > budget.max_wall_s:
            t = budget.max_wall_s
            break
        losses = []
        for j in range(per):
            m = step * per + j
            x, y = next(stream)
            for s in stages:
                x = s.forward(m, x, s.forward_version(m), y)
            grad = None
            for s in reversed(stages):
                grad, loss = s.backward(m, grad)
                if s.last:
                    losses.append(loss)
        loss = sum(losses) / per
        for s in stages:
            a, at = s.apply(), clock.update_time(s.index, step)
            busy = per * cost  # the step's forwards and backwards; the rest is bubble
            idle = at - (clock.update_time(s.index, step - 1) if step else 0.0) - busy
            record.events.emit(
                "update",
                at,
                **update_event(s, step, a, loss, compute_s=busy, wait_s=max(idle, 0.0), comm_s=0.0),
            )
        step, t = step + 1, t_next
        if snapshot_due(cfg, step):
            record.snapshots.take(t, step, torch.cat([s.w for s in stages]))
        if not math.isfinite(loss):
            status = "diverged"
            break
    return record.finish(
        model,
        torch.cat([s.w for s in stages]),
        step,
        t,
        status,
        None,
        summary_extra={**summary_extra(cfg), "sim_loop_s": time.perf_counter() - loop_start},
        bytes_sent=0,
        virtual_time=True,
    )

"""The sim runtime: a discrete-event loop on a virtual clock, in one process.

It drives the same ParameterServer, barrier and update rule as the real runtime. Each
simulated worker owns its copy of the parameters it was sent, its data shard and its
worker-side state; its gradients are computed for real on one shared model. A worker's step
takes the cluster profile's compute time in virtual seconds, barrier holds advance virtual
time exactly as they would block a real worker, and `t` in the events is virtual time.
Deterministic for a config and seed: ties in time are broken by the order of scheduling.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.algorithms.base import UPDATES
from stalebench.config import RunConfig
from stalebench.engines.ps import Push, Reply
from stalebench.errors import RunError
from stalebench.experiment import Job
from stalebench.runtime.common import (
    RunRecord,
    diverged,
    flatten_parameters,
    gradient,
    message_bytes,
    parameter_server,
    spent,
)


@dataclasses.dataclass
class SimWorker:
    params: torch.Tensor  # what it was last sent
    batches: Any
    buffers: list[torch.Tensor]  # its own BatchNorm statistics, never shared
    faults: list  # its scheduled faults, earliest first
    state: dict = dataclasses.field(default_factory=dict)  # the update rule's worker side
    version: int = 0
    clock: int = 0
    received_at: float = 0.0  # when the parameters of its current step reached it
    pushed_at: float = 0.0  # when it sent its previous push
    step_s: float = 0.0  # the current step's compute time


def launch(cfg: RunConfig) -> dict[str, Any]:
    torch.set_num_threads(cfg.num_threads)
    job = Job.build(cfg)
    # events reach the disk every 0.2 s of real time: a write per event would cost the
    # simulator more than its own bookkeeping
    record = RunRecord(job, Path(cfg.run_dir), flush_s=0.2)
    model, ps = parameter_server(job, record.events.emit)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    n, budget, profile = cfg.cluster.num_workers, cfg.budget, job.profile
    workers = [
        SimWorker(
            torch.empty_like(ps.params),
            job.batches(w),
            [b.detach().clone() for b in model.buffers()],
            profile.faults(w),
        )
        for w in range(n)
    ]
    flat = flatten_parameters(model)  # the shared model's θ, loaded per worker by one copy
    params = list(model.parameters())
    buffers = list(model.buffers())
    nbytes = message_bytes(ps.params.numel())
    queue: list[tuple[float, int, int]] = []  # (push arrives at the server, tie-break, worker)
    order = itertools.count()

    def dispatch(replies: list[Reply], t: float) -> None:
        """Each admitted worker: parameters arrive, maybe a fault strikes, it computes for
        its drawn step time, and its push travels back."""
        for r in replies:
            wk = workers[r.worker]
            wk.params.copy_(r.params)
            wk.version, wk.received_at = r.version, t + profile.pull_s(nbytes)
            start = wk.received_at
            while wk.faults and wk.faults[0].at_s <= start:
                fault = wk.faults.pop(0)
                if fault.action == "die":
                    raise RunError(
                        f"worker {r.worker} died at {start:.3f} s "
                        f"(a fault injected by cluster.faults)"
                    )
                record.events.emit(
                    "worker", start, worker=r.worker, event="pause", duration_s=fault.duration_s
                )
                start += fault.duration_s
            wk.step_s = profile.step_s(r.worker)
            arrival = start + wk.step_s + profile.push_s(nbytes)
            heapq.heappush(queue, (arrival, next(order), r.worker))

    status, error, t = "completed", None, 0.0
    loop_start = time.perf_counter()  # the simulator's own speed, reported in summary.json
    # The set-up's objects (a shard, parameters and state per worker) stay alive all run:
    # keep them out of the cyclic collector's passes, which would otherwise grow with N.
    gc.freeze()
    try:
        record.snapshots.maybe(0.0, 0, ps.params)
        dispatch(ps.start(0.0), 0.0)
        while queue:
            t, _, w = heapq.heappop(queue)
            if budget.max_wall_s and t > budget.max_wall_s:
                t = budget.max_wall_s  # the budget ends before this push arrives
                break
            wk = workers[w]
            grad, loss = _step(model, flat, params, buffers, wk)
            message = rule_cls.worker_message(cfg.algorithm.update, grad, wk.state)
            push = Push(
                w, wk.clock, wk.version, message, loss, wk.step_s, wk.received_at - wk.pushed_at
            )
            wk.clock, wk.pushed_at = wk.clock + 1, t - profile.push_s(nbytes)
            replies = ps.on_push(push, t)
            snapped = record.snapshots.maybe(t, ps.version, ps.params)
            if diverged(loss, ps.params if snapped else None):  # θ checked at snapshots
                status = "diverged"
                break
            if spent(budget, ps.version, t):
                break
            dispatch(replies, t)
    except RunError as exc:
        status, error = "failed", str(exc)
    finally:
        gc.unfreeze()
    return record.finish(
        model,
        ps.params,
        ps.version,
        t,
        status,
        error,
        bytes_sent=0,
        virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )


def _step(model, flat, params, buffers, wk: SimWorker) -> tuple[torch.Tensor, float]:
    """The worker's gradient on its own parameters and BatchNorm statistics."""
    flat.copy_(wk.params)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        shared.copy_(mine)
    out = gradient(model, params, next(wk.batches), CPU)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        mine.copy_(shared)
    return out


CPU = torch.device("cpu")

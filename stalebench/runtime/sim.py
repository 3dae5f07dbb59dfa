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
import heapq
import itertools
import traceback
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import vector_to_parameters

from stalebench.algorithms.base import UPDATES
from stalebench.config import RunConfig
from stalebench.data import shard_batches
from stalebench.engines.ps import Push, Reply
from stalebench.errors import RunError
from stalebench.experiment import Job
from stalebench.runtime.common import RunRecord, diverged, gradient, parameter_server, spent


@dataclasses.dataclass
class SimWorker:
    params: torch.Tensor  # what it was last sent
    batches: Any
    step_s: float  # virtual seconds per step
    state: dict = dataclasses.field(default_factory=dict)  # the update rule's worker side
    version: int = 0
    clock: int = 0
    received_at: float = 0.0
    pushed_at: float = 0.0


def launch(cfg: RunConfig) -> dict[str, Any]:
    torch.set_num_threads(cfg.num_threads)
    job = Job.build(cfg)
    record = RunRecord(job, Path(cfg.run_dir))
    model, ps = parameter_server(job, record.events.emit)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    n, budget = cfg.cluster.num_workers, cfg.budget
    workers = [
        SimWorker(
            torch.empty_like(ps.params),
            shard_batches(job.splits, w, n, cfg.dataset.batch_size, cfg.seed),
            job.profile.compute_target_s(w),
        )
        for w in range(n)
    ]
    params = list(model.parameters())
    device = torch.device("cpu")
    queue: list[tuple[float, int, int]] = []  # (finish time, tie-break, worker)
    order = itertools.count()

    def dispatch(replies: list[Reply], t: float) -> None:
        for r in replies:
            wk = workers[r.worker]
            wk.params.copy_(r.params)
            wk.version, wk.received_at = r.version, t
            heapq.heappush(queue, (t + wk.step_s, next(order), r.worker))

    status, error, t = "completed", None, 0.0
    try:
        record.snapshots.maybe(0.0, 0, ps.params)
        dispatch(ps.start(0.0), 0.0)
        while queue:
            t, _, w = heapq.heappop(queue)
            if budget.max_wall_s and t > budget.max_wall_s:
                t = budget.max_wall_s  # the budget ends before this step does
                break
            wk = workers[w]
            vector_to_parameters(wk.params, params)
            grad, loss = gradient(model, params, next(wk.batches), device)
            message = rule_cls.worker_message(cfg.algorithm.update, grad, wk.state)
            push = Push(
                w, wk.clock, wk.version, message, loss, wk.step_s, wk.received_at - wk.pushed_at
            )
            wk.clock, wk.pushed_at = wk.clock + 1, t
            replies = ps.on_push(push, t)
            record.snapshots.maybe(t, ps.version, ps.params)
            if diverged(loss, ps.params):
                status = "diverged"
                break
            if spent(budget, ps.version, t):
                break
            dispatch(replies, t)
    except RunError as exc:
        status, error = "failed", str(exc)
        traceback.print_exc()
    return record.finish(
        model, ps.params, ps.version, t, status, error, bytes_sent=0, virtual_time=True
    )

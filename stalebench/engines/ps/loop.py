"""The parameter server's loop, the same in either runtime: the server's role
(`program.Server`, its `Port`) feeds it the pushes its workers send.

One push at a time: the state machine (`state.ParameterServer`) applies it and returns the
replies its barrier admits, which the port sends; then θ is snapshotted when due, and the
loop decides the stop (the budget spent, θ diverged: the workers waiting for a reply are
released) or takes a checkpoint when due. A lost worker ends the run unless the barrier
goes on without it: then a spare takes its place, if one is left. Its waiting calls are
generators, taken with `yield from` (`stalebench.runtime.world`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.nn.utils import parameters_to_vector

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.config import BudgetConfig
from stalebench.engines.ps.state import ParameterServer, Push, Reply
from stalebench.job import Job
from stalebench.runtime.faults import WorkerLost
from stalebench.runtime.record import RunRecord, diverged, spent
from stalebench.runtime.world import Op


class Port(Protocol):
    """How the server reaches its workers."""

    def now(self) -> float:
        """Run time: seconds since the start (real or virtual)."""

    def next_push(self) -> Op[Push | None]:
        """The next push to arrive; None when the wall budget runs out first."""

    def send(self, replies: list[Reply]) -> Op[None]:
        """Parameters to the workers the barrier admitted: each starts its next step."""

    def stop(self, waiting: set[int]) -> Op[None]:
        """The run ends: release the workers waiting for a reply (the rest are told when
        they next push)."""

    def forget(self, worker: int) -> None:
        """The worker is lost: no longer wait for it, nor send to it."""

    def replace(self, worker: int) -> str | None:
        """A spare takes the lost worker's place, if one is left: who (for the event)."""

    def checkpoint(self) -> None:
        """Between two pushes: save what a resumed run needs, if a checkpoint is due."""


def build_server(
    job: Job, emit: Callable[..., Any], device: torch.device
) -> tuple[torch.nn.Module, ParameterServer]:
    """The model (θ₀ seeded) and the PS state machine with the configured algorithm, θ and
    the rule's state on `device` (the server's: `server_device`)."""
    cfg, n = job.cfg, job.num_workers
    model = job.model()
    params = parameters_to_vector(model.parameters()).detach().clone().to(device)
    barrier = BARRIERS.build(cfg.algorithm.barrier, n, cfg.seed)
    rule = UPDATES.build(cfg.algorithm.update, params, n)
    rule.set_shapes([p.shape for p in model.parameters()])  # a torch optimizer: per tensor
    server = ParameterServer(params, barrier, rule, n, emit, cfg.dataset.batch_size, job.numerics)
    return model, server


def serve(
    ps: ParameterServer, port: Port, record: RunRecord, budget: BudgetConfig, t: float = 0.0
) -> Op[str]:
    """From run time `t` (a resumed run's checkpoint, else 0), feed every arriving push to
    the server and send its replies, snapshot θ, and keep the budget; returns the status:
    completed or diverged. A lost worker (`WorkerLost`) ends the run unless the barrier
    lets the others go on without it."""
    record.snapshots.maybe(t, ps.version, ps.params)
    yield from port.send(ps.start(t))
    while True:  # one push in, its replies out
        try:
            push = yield from port.next_push()
            if push is None:  # the wall budget ran out while no push arrived
                yield from port.stop(set(ps.held))
                return "completed"
            replies = ps.on_push(push, port.now())
            t = port.now()
            snapped = record.snapshots.maybe(t, ps.version, ps.params)
            bad = ps.values and diverged(push.loss, ps.params if snapped else None)
            status = "diverged" if bad else None
            if status or spent(budget, ps.version, t):  # θ is checked at snapshots
                yield from port.stop(set(ps.held) | {r.worker for r in replies})
                return status or "completed"
            yield from port.send(replies)
        except WorkerLost as lost:
            if not ps.barrier.survives_loss(ps.barrier.cfg):
                raise
            yield from _lose(ps, port, record, lost)
            continue
        port.checkpoint()


def _lose(ps: ParameterServer, port: Port, record: RunRecord, lost: WorkerLost) -> Op[None]:
    """Go on without the worker, or with a spare in its place."""
    worker, now = lost.worker, port.now()
    port.forget(worker)
    spare = port.replace(worker)
    record.worker_lost(now, lost, len(ps.lost) + (spare is None))
    yield from port.send(ps.lose(worker, now))
    record.snapshots.maybe(now, ps.version, ps.params)  # the round it completed, if any
    if spare is not None:
        record.events.emit("worker", now, worker=worker, event="replaced", by=spare)
        yield from port.send(ps.rejoin(worker, now))

"""The sim runtime: a discrete-event loop on a virtual clock, in one process.

It drives the same ParameterServer, barrier and update rule as the real runtime. Each
simulated worker owns its copy of the parameters it was sent, its data shard and its
worker-side state; its gradients are computed for real on one shared model. A worker's step
takes the cluster profile's compute time in virtual seconds, barrier holds advance virtual
time exactly as they would block a real worker, and `t` in the events is virtual time.
Deterministic for a config and seed: ties in time are broken by the order of scheduling.

What communication costs is a `Network` chosen by the caller: a parameter server's
point-to-point messages (`PointToPoint`), or one ring all-reduce per synchronous round
(`RingAllReduce`); the loop below only asks it for delays, never which one it is.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from stalebench.algorithms.base import UPDATES
from stalebench.cluster import Profile
from stalebench.config import RunConfig
from stalebench.engines.ps import Push, Reply
from stalebench.errors import RunError
from stalebench.experiment import Job
from stalebench.runtime.allreduce import ring_volume, round_bytes
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


Emit = Callable[..., Any]


class Network(Protocol):
    """What the sim charges for communication, in virtual seconds."""

    def push_s(self) -> float:
        """From a worker's end of compute to its gradient reaching the update."""

    def pull_s(self) -> float:
        """From an update releasing a worker to the parameters reaching it."""

    def bytes_sent(self, updates: int) -> int:
        """Bytes on the wire after `updates` updates, for the end event."""

    def reporting(self, emit: Emit) -> Emit:
        """The emit the server's events go through (to report them as this network would)."""


@dataclasses.dataclass(frozen=True)
class PointToPoint:
    """A parameter server's links: every push and every pull is one message of `nbytes`,
    delayed by the profile's latency and bandwidth in its direction."""

    profile: Profile
    nbytes: int

    @classmethod
    def build(cls, profile: Profile, num_params: int) -> PointToPoint:
        return cls(profile, message_bytes(num_params))

    def push_s(self) -> float:
        return self.profile.push_s(self.nbytes)

    def pull_s(self) -> float:
        return self.profile.pull_s(self.nbytes)

    def bytes_sent(self, updates: int) -> int:
        return 0  # never counted here: counting now would change every PS sim's end event

    def reporting(self, emit: Emit) -> Emit:
        return emit


@dataclasses.dataclass(frozen=True)
class RingAllReduce:
    """One ring all-reduce of a round's message per synchronous round: it starts when the
    slowest worker ends its compute, takes `round_s`, and leaves the mean with every worker.

    As push delays: every gradient reaches the update `round_s` after its worker's compute
    ends, and parameters need no further delay; under a barrier that waits for the whole
    round this ends each round exactly at max(compute) + round_s, since
    max_w(c_w + a) = max_w(c_w) + a. It is only meaningful for such barriers.
    """

    round_s: float
    volume: int  # bytes all workers send in one all-reduce
    num_workers: int

    @classmethod
    def build(cls, profile: Profile, num_params: int) -> RingAllReduce:
        n = profile.cfg.num_workers
        nbytes = round_bytes(num_params, n)  # the real engine's message, tail included
        return cls(profile.allreduce_s(nbytes), ring_volume(nbytes, n), n)

    def push_s(self) -> float:
        return self.round_s

    def pull_s(self) -> float:
        return 0.0

    def bytes_sent(self, updates: int) -> int:
        return updates * self.volume

    def reporting(self, emit: Emit) -> Emit:
        return RoundReport(emit, self.num_workers, self.round_s)


class RoundReport:
    """Update events as the allreduce engine reports them: a round's events go out together
    once its slowest worker is known, each with wait_s = slowest − own compute (the wait of
    this round, not of the previous one as a server reports it) and comm_s = the all-reduce.
    """

    def __init__(self, emit: Emit, num_workers: int, comm_s: float):
        self.emit, self.num_workers, self.comm_s = emit, num_workers, comm_s
        self.round: list[tuple[float, dict[str, Any]]] = []

    def __call__(self, kind: str, t: float, **fields: Any) -> None:
        if kind != "update":
            self.emit(kind, t, **fields)
            return
        self.round.append((t, fields))
        if len(self.round) < self.num_workers:
            return  # a round's updates are emitted back to back: the rest follow at once
        slowest = max(f["compute_s"] for _, f in self.round)
        for at, f in self.round:
            self.emit(
                "update", at, **{**f, "wait_s": slowest - f["compute_s"], "comm_s": self.comm_s}
            )
        self.round.clear()


def launch(
    cfg: RunConfig, network: Callable[[Profile, int], Network] = PointToPoint.build
) -> dict[str, Any]:
    """Run `cfg` on the virtual clock, communication charged by `network(profile, params)`."""
    torch.set_num_threads(cfg.num_threads)
    job = Job.build(cfg)
    # events reach the disk every 0.2 s of real time: a write per event would cost the
    # simulator more than its own bookkeeping
    record = RunRecord(job, Path(cfg.run_dir), flush_s=0.2)
    # the network reports the server's events; it needs θ's size, known once θ is built
    report = record.events.emit
    model, ps = parameter_server(job, lambda kind, t, **fields: report(kind, t, **fields))
    net = network(job.profile, ps.params.numel())
    report = net.reporting(record.events.emit)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    n, budget, profile = cfg.cluster.num_workers, cfg.budget, job.profile
    # every worker's gradient is computed on one model, on the GPU when device=auto finds one
    # (`model` stays on the CPU for the server's snapshots and the evaluation)
    device = job.device(0)
    compute = job.model().to(device)
    workers = [
        SimWorker(
            torch.empty_like(ps.params),
            job.batches(w),
            [b.detach().clone() for b in compute.buffers()],
            profile.faults(w),
        )
        for w in range(n)
    ]
    flat = flatten_parameters(compute)  # its θ, loaded per worker by one copy
    params = list(compute.parameters())
    buffers = list(compute.buffers())
    queue: list[tuple[float, int, int]] = []  # (push arrives at the server, tie-break, worker)
    order = itertools.count()

    def dispatch(replies: list[Reply], t: float) -> None:
        """Each admitted worker: parameters arrive, maybe a fault strikes, it computes for
        its drawn step time, and its push travels back."""
        for r in replies:
            wk = workers[r.worker]
            wk.params.copy_(r.params)
            wk.version, wk.received_at = r.version, t + net.pull_s()
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
            arrival = start + wk.step_s + net.push_s()
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
            grad, loss = _step(compute, flat, params, buffers, wk, device)
            message = rule_cls.worker_message(cfg.algorithm.update, grad, wk.state)
            push = Push(
                w, wk.clock, wk.version, message, loss, wk.step_s, wk.received_at - wk.pushed_at
            )
            wk.clock, wk.pushed_at = wk.clock + 1, t - net.push_s()
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
    for kept, last in zip(model.buffers(), compute.buffers(), strict=True):
        kept.copy_(last)  # BatchNorm statistics as the last step left them, as before
    return record.finish(
        model,
        ps.params,
        ps.version,
        t,
        status,
        error,
        bytes_sent=net.bytes_sent(ps.version),
        virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )


def _step(model, flat, params, buffers, wk: SimWorker, device) -> tuple[torch.Tensor, float]:
    """The worker's gradient (on the CPU) on its own parameters and BatchNorm statistics."""
    flat.copy_(wk.params)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        shared.copy_(mine)
    out = gradient(model, params, next(wk.batches), device)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        mine.copy_(shared)
    return out

"""The parameter server in the simulator: the loop of `loop.serve` in one process, its
port an event queue on a virtual clock.

Each simulated worker owns its copy of the parameters it was sent, its data shard and its
worker-side state; its gradients are computed for real on one shared model. A worker's
step takes the cluster profile's compute time in virtual seconds, barrier holds advance
virtual time exactly as they would block a real worker, and `t` in the events is virtual
time. Deterministic for a config and seed: ties in time are broken by scheduling order.

What communication costs is a `Network`: a parameter server's point-to-point messages
(`PointToPoint`), or the buckets' all-reduces of a synchronous round (the allreduce
engine's rounds in pieces); the port only asks it for delays, never which one it is.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from stalebench.algorithms.base import UPDATES
from stalebench.cluster import Profile
from stalebench.engines.ps.loop import build_server, serve
from stalebench.engines.ps.real import message_bytes
from stalebench.engines.ps.state import Push, Reply
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.clock import EventQueue
from stalebench.runtime.faults import Faults, WorkerDied
from stalebench.runtime.record import RunRecord, flatten_parameters, gradient

Emit = Callable[..., Any]


class Network(Protocol):
    """What the sim charges for communication, in virtual seconds."""

    def push_s(self, slow_s: float = 0.0, step_s: float = 0.0) -> float:
        """From a worker's end of compute to its gradient reaching the update, when a slow
        fault adds `slow_s` to each message the worker sends and its step took `step_s`
        (communication that overlaps the step ends sooner after it)."""

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

    def push_s(self, slow_s: float = 0.0, step_s: float = 0.0) -> float:
        return self.profile.push_s(self.nbytes, slow_s)

    def pull_s(self) -> float:
        return self.profile.pull_s(self.nbytes)

    def bytes_sent(self, updates: int) -> int:
        return 0  # never counted here: counting now would change every PS sim's end event

    def reporting(self, emit: Emit) -> Emit:
        return emit


@dataclasses.dataclass
class SimWorker:
    params: torch.Tensor  # what it was last sent
    batches: Any
    buffers: list[torch.Tensor]  # its own BatchNorm statistics, never shared
    faults: Faults  # its scheduled faults
    state: dict = dataclasses.field(default_factory=dict)  # the update rule's worker side
    version: int = 0
    clock: int = 0
    received_at: float = 0.0  # when the parameters of its current step reached it
    pushed_at: float = 0.0  # when it sent its previous push
    push_s: float = 0.0  # how long its push under way takes (a slow fault lengthens it)
    step_s: float = 0.0  # the current step's compute time


class SimPort:
    """The `serve` loop's port on a virtual clock: a reply schedules the worker's push
    (pull delay, faults, its step time, push delay); a push is computed when it arrives."""

    def __init__(self, job: Job, net: Network, record: RunRecord, ps_params: torch.Tensor):
        cfg = job.cfg
        self.cfg, self.net, self.record, self.profile = cfg, net, record, job.profile
        self.rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
        # every worker's gradient is computed on one model, on the GPU when device=auto
        # finds one (the server's model stays on the CPU for snapshots and the evaluation)
        self.device = job.device(0)
        self.compute = job.model().to(self.device)
        self.flat = flatten_parameters(self.compute)  # its θ, loaded per worker by one copy
        self.params = list(self.compute.parameters())
        self.buffers = list(self.compute.buffers())
        self.workers = [
            SimWorker(
                torch.empty_like(ps_params),
                job.batches(w),
                [b.detach().clone() for b in self.compute.buffers()],
                Faults(job.profile, w),
            )
            for w in range(job.num_workers)
        ]
        self.queue = EventQueue()  # a push arriving at the server, by worker
        self.t = 0.0
        self.job, self.spares = job, 0  # spares taken so far
        self.batch_size = cfg.dataset.batch_size

    def now(self) -> float:
        return self.t

    def send(self, replies: list[Reply]) -> None:
        for r in replies:
            wk = self.workers[r.worker]
            wk.params.copy_(r.params)
            wk.version, wk.received_at = r.version, self.t + self.net.pull_s()
            try:
                start = wk.faults.strike(wk.received_at, self._pause(r.worker))
            except WorkerDied as died:  # the server learns of it at that time
                self.queue.push(wk.received_at, died)
                continue
            wk.step_s = self.profile.step_s(r.worker)
            if r.batch and r.batch != self.batch_size:  # re-assigned: DBS
                wk.step_s *= r.batch / self.batch_size  # the profile's time is for batch_size
            if r.batch and r.batch != wk.batches.size:
                wk.batches.size = r.batch
            wk.push_s = self.net.push_s(wk.faults.slow_s, wk.step_s)
            self.queue.push(start + wk.step_s + wk.push_s, r.worker)

    def forget(self, worker: int) -> None:
        pass  # a lost worker has nothing scheduled

    def replace(self, worker: int) -> str | None:
        """As the real runtime's spare: a fresh process (BatchNorm statistics and worker-side
        rule state of a new model) on the lost worker's shard from its clock, now."""
        if self.spares == self.cfg.cluster.spares:
            return None
        self.spares += 1
        wk = self.workers[worker]
        wk.buffers = [b.detach().clone() for b in self.job.model().buffers()]
        wk.state = {}
        wk.faults = Faults(self.profile, worker, self.t, wk.clock, replaced=True)
        wk.pushed_at = self.t + self.net.pull_s()  # as it receives θ: its first rtt is 0
        return f"spare {self.spares - 1}"

    def checkpoint(self) -> None:
        pass  # a simulated run is rerun from the start: it takes seconds, deterministically

    def _pause(self, worker: int):
        def pause(at: float, seconds: float) -> None:
            self.record.events.emit("worker", at, worker=worker, event="pause", duration_s=seconds)

        return pause

    def next_push(self) -> Push | None:
        if not self.queue:
            return None
        t, w = self.queue.pop()
        max_wall_s = self.cfg.budget.max_wall_s
        if max_wall_s and t > max_wall_s:
            self.t = max_wall_s  # the budget ends before this push arrives
            return None
        self.t = t
        if isinstance(w, WorkerDied):
            raise w
        wk = self.workers[w]
        grad, loss = _step(self.compute, self.flat, self.params, self.buffers, wk, self.device)
        message = self.rule_cls.worker_message(self.cfg.algorithm.update, grad, wk.state)
        push = Push(
            w, wk.clock, wk.version, message, loss, wk.step_s, wk.received_at - wk.pushed_at
        )
        wk.clock, wk.pushed_at = wk.clock + 1, t - wk.push_s
        return push

    def stop(self, waiting: set[int]) -> None:
        pass  # nobody waits on a virtual clock


def _step(model, flat, params, buffers, wk: SimWorker, device) -> tuple[torch.Tensor, float]:
    """The worker's gradient (on the CPU) on its own parameters and BatchNorm statistics."""
    flat.copy_(wk.params)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        shared.copy_(mine)
    out = gradient(model, params, next(wk.batches), device)
    for mine, shared in zip(wk.buffers, buffers, strict=True):
        mine.copy_(shared)
    return out


def simulate(
    job: Job, run_dir: Path, network: Callable[[Profile, int], Network] = PointToPoint.build
) -> dict[str, Any]:
    """Run the job on the virtual clock, communication charged by `network(profile, d)`."""
    cfg = job.cfg
    torch.set_num_threads(cfg.num_threads)
    # events reach the disk every 0.2 s of real time: a write per event would cost the
    # simulator more than its own bookkeeping
    record = RunRecord(job, run_dir, flush_s=0.2)
    # the network reports the server's events; it needs θ's size, known once θ is built
    report = record.events.emit
    model, ps = build_server(job, lambda kind, t, **fields: report(kind, t, **fields))
    net = network(job.profile, ps.params.numel())
    report = net.reporting(record.events.emit)
    port = SimPort(job, net, record, ps.params)
    status, error = "completed", None
    loop_start = time.perf_counter()  # the simulator's own speed, reported in summary.json
    # The set-up's objects (a shard, parameters and state per worker) stay alive all run:
    # keep them out of the cyclic collector's passes, which would otherwise grow with N.
    gc.freeze()
    try:
        status = serve(ps, port, record, cfg.budget)
    except RunError as exc:
        status, error = "failed", str(exc)
    finally:
        gc.unfreeze()
    for kept, last in zip(model.buffers(), port.compute.buffers(), strict=True):
        kept.copy_(last)  # BatchNorm statistics as the last step left them
    return record.finish(
        model,
        ps.params,
        ps.version,
        port.now(),
        status,
        error,
        bytes_sent=net.bytes_sent(ps.version),
        virtual_time=True,
        summary_extra={"sim_loop_s": time.perf_counter() - loop_start},
    )

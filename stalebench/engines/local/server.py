"""engine.mode=async in the real runtime: asynchronous local SGD. Rank 0 serves: it applies
each worker's Δ the moment it arrives (`round.Arrivals`) and replies with θ and the
worker's next H; ranks 1..M are workers, each taking its H inner steps from the θ it was
last sent and pushing Δ = θ_read − x. Nobody waits for anybody: a paused worker only
delays its own pushes.

On the wire (the profile's delays paid by the transport): a push is a float32 header
(`round.HEADER`) then Δ in the wire's format; a reply a float32 header (`round.REPLY`)
then θ. When the budget is spent the worker that pushed is told to stop, and every other
at its next push (discarded).
"""

from __future__ import annotations

import logging
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from stalebench.algorithms.local import OUTER
from stalebench.engines.common import Net
from stalebench.engines.local.round import (
    HEADER,
    PARAMS,
    PUSH,
    REPLY,
    STOP,
    Arrivals,
    Replica,
    Wire,
    async_event,
    reply_bytes,
    segments,
)
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime.faults import Shaped, WorkerLost, pad_to
from stalebench.runtime.receiver import Inbox
from stalebench.runtime.record import RunRecord, diverged, gradient, spent
from stalebench.runtime.transport import Transport

log = logging.getLogger("stalebench")


def wire_of(job: Job, net: Net) -> Wire:
    d = net.flat.numel()
    return Wire(job.cfg.engine.quantize, segments([p.numel() for p in net.params], slice(0, d)))


class Server:
    """Rank 0: θ, the outer rule, and the run directory."""

    def __init__(self, job: Job, run_dir: Path, transport: Transport):
        self.job, self.cfg, self.transport = job, job.cfg, transport
        self.m = job.num_workers
        self.record = RunRecord(job, run_dir)
        self.net = Net(job, torch.device("cpu"))
        self.theta = self.net.flat.detach().clone()
        self.arrivals = Arrivals(job, self.theta)
        self.wire, d = wire_of(job, self.net), self.theta.numel()
        self.push_bytes = 4 * HEADER + self.wire.nbytes(d)
        self.pull_bytes = reply_bytes(d)
        make = lambda rank: [torch.empty(HEADER), self.wire.encode(torch.zeros(d))]  # noqa: E731
        peers = {w: w + 1 for w in range(self.m)}
        self.inbox = Inbox(transport, peers, make, self.now, self.cfg.timeout_s)
        self.out = torch.empty(REPLY + d)
        self.active = set(range(self.m))  # workers not yet told to stop
        self.lost: set[int] = set()
        self.rounds = [0] * self.m

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> dict[str, Any]:
        status, error, a = "completed", None, self.arrivals
        self.t0 = time.perf_counter()
        try:
            self.inbox.start()
            for w in range(self.m):
                self.reply(w, PARAMS, a.steps)
            while (item := self.next(self.cfg.budget.max_wall_s)) is not None:
                w, (header, payload) = item
                if header[0] != PUSH:
                    raise RunError(f"worker {w} sent message kind {header[0]:g}, expected a push")
                status = self.arrive(w, header, payload)
                if status != "completed" or spent(self.cfg.budget, a.version, self.now()):
                    self.reply(w, STOP, 0)
                    break
                self.reply(w, PARAMS, a.next_steps(w))
            t_end = self.now()
            while self.active and (item := self.next(0.0)):  # a push that crossed our
                self.reply(item[0], STOP, 0)  # decision to stop: discarded
        except Exception as exc:
            status, error, t_end = "failed", str(exc), self.now()
            log.error("server: %s\n%s", exc, traceback.format_exc())
        return self.record.finish(
            self.net.model, self.theta, a.version, t_end, status, error,
            bytes_sent=a.version * (self.push_bytes + self.pull_bytes),
        )  # fmt: skip

    def next(self, max_wall_s: float):
        """The next push, or None when the wall budget runs out first. A lost worker is
        recorded and the others go on (nobody waits for it); losing all fails the run."""
        while True:
            try:
                return self.inbox.next(self.active, max_wall_s)
            except WorkerLost as lost:
                self.active.discard(lost.worker)
                self.inbox.receivers[lost.worker].close()
                self.lost.add(lost.worker)
                self.record.worker_lost(self.now(), lost, len(self.lost))
                if not self.active:
                    return None

    def arrive(self, w: int, header: torch.Tensor, payload: torch.Tensor) -> str:
        """Apply worker w's push; its events; the run's status after it."""
        _, clock, read, steps, compute, loss, paused, rtt, err = header.tolist()
        delta = self.wire.decode(payload)
        lag = self.arrivals.apply(w, delta, int(read), int(steps), compute)
        t, version = self.now(), self.arrivals.version
        if paused > 0:
            self.record.events.emit("worker", t, worker=w, event="pause", duration_s=paused)
        stats = [compute, loss, paused, float(delta.norm()), err]
        nbytes = self.push_bytes + self.pull_bytes
        fields = async_event(w, int(clock), version, lag, stats, int(steps), rtt, nbytes)
        self.record.events.emit("update", t, **fields)
        self.record.snapshots.maybe(t, version, self.theta)
        self.rounds[w] += 1
        return "diverged" if diverged(loss, self.theta) else "completed"

    def reply(self, w: int, kind: float, steps: int) -> None:
        self.out[:REPLY] = torch.tensor([kind, self.arrivals.version, steps, 0.0])
        if kind == STOP:
            self.active.discard(w)
            self.inbox.receivers[w].close()
            try:
                self.transport.send(self.out, w + 1)
                self.record.events.emit("worker", self.now(), worker=w, event="stop")
            except Exception as exc:  # best effort: the run is ending
                log.warning("could not stop worker %d: %s", w, exc)
            return
        self.out[REPLY:] = self.theta
        try:
            self.transport.send(self.out, w + 1)
        except RunError as exc:  # it died since its push: its receiver reports the loss
            log.warning("server: %s", exc)
        self.inbox.receivers[w].arm(self.now())


def work(job: Job, worker: int, transport: Transport) -> None:
    """Rank worker + 1: from each θ it is sent, H inner steps (each at the profile's step
    time, faults striking at step starts), then push Δ; until told to stop."""
    cfg, profile = job.cfg, job.profile
    net = Net(job, job.device(worker))
    d = net.flat.numel()
    rep, wire = Replica(job, worker, net.flat.detach().cpu(), net), wire_of(job, net)
    transport = Shaped(transport, profile, rep.faults)
    rule = OUTER.build(cfg.algorithm.outer, torch.zeros(d), job.num_workers)
    inbox, header = torch.empty(REPLY + d), torch.zeros(HEADER)
    warm = (job.splits.x_train[:1], job.splits.y_train[:1])
    gradient(net.model, net.params, warm, net.device)
    clock, delta, pushed_at, t0 = 0, None, None, None
    while True:
        transport.recv(inbox, 0)
        received = time.perf_counter()
        t0 = received if t0 is None else t0
        kind, version, steps = inbox[:3].tolist()
        if kind == STOP:
            return
        theta = inbox[REPLY:]
        if delta is None:
            rep.x.copy_(theta)
        else:
            rule.replica(rep.x, delta, theta)
        rep.inner.new_round()
        compute, paused, losses = 0.0, 0.0, []
        for _ in range(int(steps)):
            now = time.perf_counter() - t0
            paused += rep.faults.strike(now, lambda at, s: time.sleep(s)) - now
            start, target_s = time.perf_counter(), profile.step_s(worker)
            losses.append(rep.step(net))
            pad_to(start, target_s)
            compute += time.perf_counter() - start
        delta = theta - rep.x
        rtt = received - pushed_at if pushed_at is not None else 0.0
        loss = statistics.fmean(losses)
        err = wire.error(delta)
        header[:] = torch.tensor([PUSH, clock, version, steps, compute, loss, paused, rtt, err])
        pushed_at = time.perf_counter()
        transport.send_all([header, wire.encode(delta)], 0)
        clock += 1

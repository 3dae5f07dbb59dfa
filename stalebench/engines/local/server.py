"""engine.mode=async, asynchronous local SGD, as two roles written once for both runtimes
(`stalebench.runtime.world`).

The protocol: rank 0 serves (a hub: its workers pay the network both ways): it applies
each worker's Δ the moment it arrives (`round.Arrivals`) and replies with θ and the
worker's next H. Ranks 1..M are workers: from each θ they are sent, H inner steps, then a
push of Δ = θ_read − x. Nobody waits for anybody: a paused worker only delays its own
pushes, a lost one is recorded and the others go on (no spares). The server decides the
stop (the budget spent, θ diverged): the worker that pushed is told at once, every other
at its next push (discarded).

Wire format: one float32 tensor per message. A push is `HEADER` slots — float64s compute_s,
loss, paused_s, rtt_s (the worker's time from its previous push, or the start, to
receiving θ), ‖Δ‖ and the wire's error, then int32s clock, version read and H — then Δ in
the wire's type, in the bytes that follow. A reply is `REPLY` int32 slots (kind, version,
next H) then θ.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

import numpy as np
import torch

from stalebench import placement
from stalebench.algorithms.local import OUTER
from stalebench.engines.common import Net, late_loss
from stalebench.engines.local.round import Arrivals, Replica, Wire, async_event, segments
from stalebench.errors import RunError, with_traceback
from stalebench.job import Job
from stalebench.runtime.driver import Ending, Role
from stalebench.runtime.faults import WorkerLost
from stalebench.runtime.record import diverged, gradient, spent
from stalebench.runtime.world import Op, World

log = logging.getLogger("stalebench")

HEADER = 16  # float32 slots: 6 float64s, 3 int32s, one unused (the payload 8-byte aligned)
REPLY = 4  # int32 slots: kind, version, next H, unused
PARAMS, STOP = 2, 3


def wire_of(job: Job, net: Net) -> Wire:
    sizes, num_params = [p.numel() for p in net.params], net.flat.numel()
    return Wire(job.cfg.engine.quantize, segments(sizes, slice(0, num_params)))


class Push:
    """A push's views of its message: `floats` the float64 slots, `ints` the int32 ones,
    `delta` the payload in the wire's type."""

    def __init__(self, buf: torch.Tensor, wire: Wire, num_params: int):
        header = buf[:HEADER].numpy()
        self.floats, self.ints = header[:12].view(np.float64), header[12:15].view(np.int32)
        self.delta = buf[HEADER:].view(torch.uint8)[: wire.nbytes(num_params)].view(wire.dtype)

    @staticmethod
    def size(wire: Wire, num_params: int) -> int:
        return HEADER + -(-wire.nbytes(num_params) // 4)  # float32 slots


class Server(Role):
    """Rank 0: θ, the outer rule, and the run directory."""

    def __init__(self, job: Job, world: World):
        self.cfg, self.world, self.num_workers = job.cfg, world, job.num_workers
        world.hub = True
        self.record, self.numerics = world.record, job.numerics  # false: cost-only
        # its own net, on its device (`server_device`): in the simulator workers share one
        self.device = world.device
        self.net = Net(job, self.device)
        self.theta = self.net.flat.detach().clone()
        self.arrivals = Arrivals(job, self.theta)
        self.wire, num_params = wire_of(job, self.net), self.theta.numel()
        size = Push.size(self.wire, num_params)
        self.message_bytes = 4 * (size + REPLY + num_params)  # a push and its reply
        ranks, workers = range(1, self.num_workers + 1), range(self.num_workers)
        pushes = {rank: world.mailbox(rank, 0, size, HEADER) for rank in ranks}
        self.pushed: dict[int, Push] = {}  # the views of each buffer a push came in
        self.replies = {rank: world.mailbox(0, rank, REPLY + num_params, REPLY) for rank in ranks}
        # worker w is rank w + 1
        self.listener = world.listen({w: w + 1 for w in workers}, lambda rank: [pushes[rank]])
        self.active = set(workers)  # workers not yet told to stop
        self.lost: set[int] = set()
        self.ended_at: float | None = None  # the run's end, once past
        self.serving = False  # past θ₀'s snapshot: an error fails the run

    def run(self) -> Op[Ending]:
        world, arrivals, status = self.world, self.arrivals, "completed"
        self.record.snapshots.maybe(0.0, 0, self.theta)
        self.serving = True
        for worker in range(self.num_workers):
            yield from self.reply(worker, PARAMS, arrivals.steps)
        while (item := (yield from self.next(self.cfg.budget.max_wall_s))) is not None:
            worker, push = item
            status = self.arrive(worker, push)
            if status != "completed" or spent(self.cfg.budget, arrivals.version, world.now()):
                yield from self.reply(worker, STOP, 0)
                break
            yield from self.reply(worker, PARAMS, arrivals.next_steps(worker))
        t_end = self.ended_at = world.now()
        while self.active and (item := (yield from self.next(0.0, read=False))):
            yield from self.reply(item[0], STOP, 0)  # a push that crossed the end: dropped
        return self.ending(t_end, status)

    def fail(self, exc: Exception) -> Op[Ending]:
        if not self.serving:
            raise exc
        t_end = self.world.now()
        log.error("server: %s", exc, exc_info=with_traceback(exc))
        return self.ending(t_end, "failed")
        yield  # unreachable: an op

    def ending(self, t_end: float, status: str) -> Ending:
        version = self.arrivals.version
        return Ending(self.net.model, self.theta, version, t_end, status,
                      bytes_sent=version * self.message_bytes)  # fmt: skip

    def next(self, until: float, read: bool = True) -> Op[tuple[int, Push] | None]:
        """The next push and its worker, or None when run time `until` passes first. A
        lost worker is recorded and the others go on; losing all fails the run."""
        while self.active:
            try:
                item = yield from self.listener.next(self.active, until, read)
            except WorkerLost as lost:
                self.active.discard(lost.worker)
                self.listener.close(lost.worker)
                self.lost.add(lost.worker)
                if self.ended_at is not None:  # heard after the end: the run's if before it
                    late_loss(self.record, self.world, lost.worker + 1, lost, self.ended_at)
                    continue
                self.record.worker_lost(self.world.now(), lost, len(self.lost))
                continue
            if item is None:
                return None
            worker, (buf,) = item
            if buf.data_ptr() not in self.pushed:
                self.pushed[buf.data_ptr()] = Push(buf, self.wire, self.theta.numel())
            return worker, self.pushed[buf.data_ptr()]
        return None

    def arrive(self, worker: int, push: Push) -> str:
        """Apply `worker`'s push; its events; the run's status after it."""
        record = self.record
        compute, loss, paused, rtt, norm, err = push.floats.tolist()
        clock, read, steps = push.ints.tolist()
        delta = None  # cost-only: no Δ
        if self.numerics:  # decoded on the host, then to θ's device (queued)
            delta = self.wire.decode(push.delta).to(self.device, non_blocking=True)
        lag = self.arrivals.apply(worker, delta, read, steps, compute)
        t, version = self.world.now(), self.arrivals.version
        if paused > 0:
            record.events.emit("worker", t, worker=worker, event="pause", duration_s=paused)
        stats = [compute, loss, paused, norm, err]
        fields = async_event(worker, clock, version, lag, stats, steps, rtt, self.message_bytes)
        record.events.emit("update", t, **fields)
        record.snapshots.maybe(t, version, self.theta)
        return "diverged" if self.numerics and diverged(loss, self.theta) else "completed"

    def reply(self, worker: int, kind: int, steps: int) -> Op[None]:
        out = self.replies[worker + 1]
        out[:REPLY].numpy().view(np.int32)[:3] = kind, self.arrivals.version, steps
        if kind == STOP:
            self.active.discard(worker)
            self.listener.close(worker)
        elif self.numerics:  # a cost-only reply: its header (θ has no values)
            out[REPLY:].copy_(self.theta, non_blocking=True)
            placement.synchronize(self.device)  # from a GPU: θ is in the mailbox
        try:
            yield from self.world.send(out, worker + 1)
        except RunError as exc:  # it died since its push: the listener reports the loss
            log.warning("server: %s", exc)
            return
        if kind == STOP:
            self.record.events.emit("worker", self.world.now(), worker=worker, event="stop")
        else:
            self.listener.arm(worker)


class Worker(Role):
    """Rank `worker` + 1: from each θ it is sent, H inner steps (each at the profile's step
    time, faults striking at step starts), then push Δ; until told to stop."""

    def __init__(self, job: Job, world: World):
        self.job, self.world, self.worker = job, world, world.rank - 1
        self.net = net = world.shared("net", lambda: Net(job, world.device))
        num_params = net.flat.numel()
        self.replica = Replica(job, self.worker, net.flat.detach(), net)  # on its device
        self.wire = wire_of(job, net)
        world.play(self.worker)
        self.rule = OUTER.build(job.cfg.algorithm.outer,
                                torch.zeros(num_params, device=net.flat.device),
                                job.num_workers)  # fmt: skip
        self.inbox = world.mailbox(0, world.rank, REPLY + num_params, REPLY)
        self.message = world.mailbox(world.rank, 0, Push.size(self.wire, num_params), HEADER)
        self.push = Push(self.message, self.wire, num_params)

    def warm_up(self) -> Any:
        warm = (self.job.splits.x_train[:1], self.job.splits.y_train[:1])
        return gradient(self.net.forward, self.net.params, warm, self.net.device)

    def run(self) -> Op[None]:
        job, world, replica = self.job, self.world, self.replica
        inbox, push = self.inbox, self.push
        clock, delta, pushed_at = 0, None, 0.0
        while True:
            yield from world.recv(inbox, 0)
            received = world.now()
            kind, version, steps = inbox[:REPLY].numpy().view(np.int32)[:3].tolist()
            if kind == STOP:
                return None
            theta = inbox[REPLY:]  # in a cost-only run none: it has no values, nor has Δ
            if job.numerics:  # to the replica's device (queued, from a pinned mailbox)
                theta = theta.to(replica.x.device, non_blocking=True)
            if job.numerics and delta is None:
                replica.x.copy_(theta)
            elif job.numerics:
                self.rule.replica(replica.x, delta, theta)
            compute, paused, losses = yield from self.inner_steps(steps)
            norm = error = math.nan
            if job.numerics:
                delta = theta - replica.x
                push.delta.copy_(self.wire.encode(delta))
                norm, error = float(delta.norm()), self.wire.error(delta)
            loss = statistics.fmean(losses)
            push.floats[:] = compute, loss, paused, received - pushed_at, norm, error
            push.ints[:] = clock, version, steps
            pushed_at = world.now()
            yield from world.send(self.message, 0)
            clock += 1

    def inner_steps(self, steps: int) -> Op[tuple[float, float, list[float]]]:
        """H inner steps from the θ received: their compute time, pauses and losses."""
        world, replica, profile = self.world, self.replica, self.job.profile
        replica.inner.new_round()
        compute, paused, losses = 0.0, 0.0, []
        for _ in range(steps):
            paused += world.strike()
            step = replica.step(self.net)
            loss, seconds = yield from world.compute(step, profile.step_s(self.worker))
            losses.append(loss)
            compute += seconds
        return compute, paused, losses

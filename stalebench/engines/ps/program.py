"""engine=ps's two roles, written once for both runtimes (`stalebench.runtime.world`).

The protocol: the server (rank 0, a hub: its workers pay the network both ways) runs
`loop.serve` with itself as the port: it takes each push as it arrives, feeds it to the
state machine and sends θ to the workers its barrier admits. A worker (ranks 1..N), from
each θ it is sent, strikes its faults, computes a gradient on the next minibatch of its
shard (the profile's step time) and pushes it with the version it read. The server decides
the stop (budget spent, θ diverged): STOP goes at once to the workers waiting for a reply,
and to the others at their next push (discarded). A spare (a rank after the N workers)
waits, set up, for a lost worker's place — its index, clock and start time come in its
first reply — or for STOP at the end.

Wire format: one float32 tensor per message, HEADER slots (32 bytes) then a model-sized
payload. The header holds int32s and float64s, packed and read in place with `struct`
(`PUSH`, `REPLY`: no torch operation), so clocks, losses and times cross exactly.
"""

from __future__ import annotations

import logging
import math
import struct
from typing import Any

import torch

from stalebench import placement, precision
from stalebench.algorithms.base import UPDATES
from stalebench.engines.common import GradientStep, Net, catch_up, late_loss
from stalebench.engines.ps.loop import build_server, serve
from stalebench.engines.ps.state import Push, Reply
from stalebench.errors import RunError, with_traceback
from stalebench.job import Job
from stalebench.runtime.driver import Ending, Role, attempt
from stalebench.runtime.faults import WorkerLost
from stalebench.runtime.record import gradient
from stalebench.runtime.world import Op, World

log = logging.getLogger("stalebench")

HEADER = 8  # float32 slots before the payload of every message
# a push: int32s clock, version read; float64s loss, compute_s, rtt_s (the worker's time
# from its previous push, or the start, to receiving these parameters). The worker writes
# the loss with its gradient (`LOSS`, at byte 8), the rest as it sends (`SENT`, `TIMES`).
PUSH, SENT, LOSS, TIMES = map(struct.Struct, ("=2i3d", "=2i", "=d", "=2d"))
# a reply: int32s kind, version, the worker's clock (a resumed run's workers start at their
# checkpointed clocks), the worker's index, the minibatch size of its step; then (at byte
# 24) float64 the run time the worker starts at (the run's start, or when a spare joined)
REPLY = struct.Struct("=5i4xd")
PARAMS, STOP = 2, 3


class Header:
    """A message's buffer: its header's bytes (`raw`, a numpy view of the CPU buffer, for
    `struct` to pack and unpack in place) and the `payload` after them — in a cost-only
    run a payload of `num_params` slots without values, the mailbox holding the header
    alone (the world charges the whole message: `World.mailbox`)."""

    def __init__(self, buf: torch.Tensor, num_params: int):
        self.raw = buf[:HEADER].numpy()
        self.payload = (
            buf[HEADER:] if buf.numel() > HEADER else torch.zeros(num_params, device="meta")
        )


class Server(Role):
    """Rank 0: the `serve` loop's port. It also tells the workers still computing to stop
    once the run has ended, and writes the run directory."""

    def __init__(self, job: Job, world: World):
        cfg, n = job.cfg, job.num_workers
        self.job, self.cfg, self.world, self.n = job, cfg, world, n
        self.now = world.now  # the port's clock is the world's
        world.hub = True
        self.record = record = world.record
        self.device = device = world.device  # θ's and the rule's (`server_device`)
        self.model, self.ps = build_server(job, record.events.emit, device)
        self.started_at, self.bytes = 0.0, 0  # run time and bytes before this process
        if record.resumed:
            self.ps.resume(record.resumed["state"]["ps"])
            self.started_at = record.resumed["t"]
            self.bytes = record.resumed["state"]["bytes_sent"]
        num_params = self.ps.params.numel()
        self.message_bytes = 4 * (HEADER + num_params)
        probe: dict = {}  # a rule whose workers keep state (DANA-Slim's momentum): no checkpoints
        UPDATES.get(cfg.algorithm.update.name)[0].worker_message(
            cfg.algorithm.update, torch.zeros(num_params), probe
        )
        self.worker_state = bool(probe)
        ranks = range(1, n + 1 + cfg.cluster.spares)
        # a mailbox each way per rank: a push is read in place until the reply to it
        size = HEADER + num_params
        pushes = {rank: world.mailbox(rank, 0, size, HEADER) for rank in ranks}
        self.replies = {rank: world.mailbox(0, rank, size, HEADER) for rank in ranks}
        self.reply_views = {rank: Header(box, num_params) for rank, box in self.replies.items()}
        # the views of each buffer a push comes in (the listener's `make`), by its address
        self.push_views = {box.data_ptr(): Header(box, num_params) for box in pushes.values()}
        # a server on a GPU: a push's gradient copied up from its (pinned) mailbox into one
        # buffer, which the state machine reads (or copies) before the next push is read
        payload = next(iter(self.push_views.values())).payload
        self.grad_in = (
            None if payload.device == device else torch.empty_like(payload, device=device)
        )
        peers = {worker: worker + 1 for worker in range(n)}
        self.listener = world.listen(peers, lambda rank: [pushes[rank]])
        self.active = set(range(n))  # workers not yet sent STOP
        self.ranks = list(range(1, n + 1))  # each worker's rank: a spare's once replaced
        self.spares = list(range(n + 1, n + 1 + cfg.cluster.spares))
        self.joined_at: dict[int, float] = {}  # run time a spare took a worker's place
        self.served = False  # past the serve loop: the run's end is recorded

    def run(self) -> Op[Ending]:
        world, ps = self.world, self.ps  # the clock starts at the checkpoint's time
        yield from self.stop(set(ps.lost))  # a resumed run: the workers lost before stay out
        status = yield from serve(ps, self, self.record, self.cfg.budget, self.started_at)
        t_end, self.served = world.now(), True
        while self.active:  # a push that crossed the end: discard it
            try:
                item = yield from self.listener.next(self.active, read=False)
            except WorkerLost as lost:  # heard after the end: the run's loss if before it
                self.forget(lost.worker)
                late_loss(self.record, world, self.ranks[lost.worker], lost, t_end)
                continue
            worker = item[0]
            self.active.discard(worker)
            yield from self._stop_ranks([self.ranks[worker]])
        return (yield from self.ending(t_end, status))

    def fail(self, exc: Exception) -> Op[Ending]:
        """The workers waiting for a reply are told to stop (the others at their push)."""
        if self.served:
            raise exc
        log.error("server: %s", exc, exc_info=with_traceback(exc))
        t_end = self.world.now()
        yield from self.stop(set(self.ps.held))
        return (yield from self.ending(t_end, "failed"))

    def ending(self, t_end: float, status: str) -> Op[Ending]:
        yield from self._stop_ranks(self.spares)  # the spares never needed
        ps = self.ps
        return Ending(self.model, ps.params, ps.version, t_end, status, bytes_sent=self.bytes)

    def checkpoint(self) -> None:
        t, world = self.now(), self.world
        if not world.checkpoint_due(t):
            return
        if self.worker_state:  # e.g. DANA-Slim's momentum, on the workers: none is saved
            log.warning("server: the workers keep state of their own: no checkpoints")
            world.next_checkpoint = math.inf
            return
        world.checkpoint_taken(t)
        state = {"ps": self.ps.state(), "bytes_sent": self.bytes}
        self.record.checkpoints.save(t, self.ps.version, state)

    def next_push(self) -> Op[Push | None]:
        item = yield from self.listener.next(self.active, self.cfg.budget.max_wall_s)
        if item is None:
            return None
        worker, (buf,) = item
        view = self.push_views[buf.data_ptr()]
        self.bytes += self.message_bytes
        clock, version, loss, compute_s, rtt_s = PUSH.unpack_from(view.raw)
        grad = view.payload
        if self.grad_in is not None:  # asynchronous from pinned memory, ordered before the update
            grad = self.grad_in.copy_(grad, non_blocking=True)
        return Push(worker, clock, version, grad, loss, compute_s, rtt_s)

    def send(self, replies: list[Reply]) -> Op[None]:
        for reply in replies:  # θ into every reply's mailbox (from a GPU: queued together)
            rank = self.ranks[reply.worker]
            self.reply_views[rank].payload.copy_(reply.params, non_blocking=True)
        if replies:
            placement.synchronize(self.device)  # a GPU's copies are in the mailboxes
        for reply in replies:
            worker = reply.worker
            rank, clock = self.ranks[worker], self.ps.clocks[worker]
            out, view = self.replies[rank], self.reply_views[rank]
            joined = self.joined_at.get(worker, self.started_at)
            REPLY.pack_into(view.raw, 0, PARAMS, reply.version, clock, worker, reply.batch, joined)
            try:
                yield from self.world.send(out, rank)
                self.bytes += self.message_bytes
            except RunError as exc:  # it died since its push: the listener reports the loss
                log.warning("server: %s", exc)
            self.listener.arm(worker)

    def forget(self, worker: int) -> None:
        self.active.discard(worker)
        self.listener.close(worker)

    def replace(self, worker: int) -> str | None:
        if not self.spares:
            return None
        rank = self.spares.pop(0)
        self.ranks[worker], self.joined_at[worker] = rank, self.now()
        self.listener.replace(worker, rank)
        self.active.add(worker)
        return f"spare {rank - 1 - self.n} (rank {rank})"

    def stop(self, waiting: set[int]) -> Op[None]:
        """Tell the workers waiting for a reply to stop; the others (still computing) are
        told at their next push."""
        for worker in sorted(waiting & self.active):
            self.forget(worker)
            if (yield from self._stop_ranks([self.ranks[worker]])):
                self.record.events.emit("worker", self.now(), worker=worker, event="stop")

    def _stop_ranks(self, ranks: list[int]) -> Op[bool]:
        stopped = True
        for rank in ranks:
            REPLY.pack_into(self.reply_views[rank].raw, 0, STOP, self.ps.version, 0, 0, 0, 0.0)
            sent = self.world.send(self.replies[rank], rank)
            stopped = (yield from attempt(sent, f"could not stop rank {rank}")) and stopped
        return stopped


class Worker(Role):
    """Rank r: worker r − 1, or a spare (r > N) until a lost worker's place is its own (its
    index, clock and start time come in its first reply)."""

    def __init__(self, job: Job, world: World):
        self.job, self.world, self.cfg, self.profile = job, world, job.cfg, job.profile
        rank = world.rank
        self.spare = rank > job.num_workers
        # the model a process's workers compute on (in the simulator, all of them), and the
        # buffer replies arrive in (a header, then the θ its step reads in place: the next
        # reply comes only once the server has read the push)
        self.net = net = world.shared("net", lambda: Net(job, world.device))
        num_params = net.flat.numel()
        size = HEADER + num_params
        self.inbox = world.mailbox(0, rank, size, HEADER)
        self.buffers = [b.detach().clone() for b in net.buffers]  # its own BatchNorm
        self.scale = precision.loss_scale(net.device)  # fp16: its own loss scale
        self.out = world.mailbox(rank, 0, size, HEADER)
        # the views of the reply it reads and the push it writes
        self.reply, self.push = Header(self.inbox, num_params), Header(self.out, num_params)
        self.rule = UPDATES.get(self.cfg.algorithm.update.name)[0]
        self.rule_state: dict = {}  # the rule's worker side (e.g. DANA-Slim's momentum)
        self.worker, self.clock = -1, 0  # the worker it plays (-1: a spare, not yet)
        # a worker's shard is its rank's (set up before the clock starts); a spare's is the
        # lost worker's, read once it takes that place
        self.batches = None if self.spare else job.batches(rank - 1)
        # set up as a fresh run's worker before the clock starts (index, clock, run time),
        # until the first reply says who it is (a resumed run's may say otherwise)
        self.joined: tuple | None = None
        if not self.spare:
            self.join(rank - 1, 0, 0.0)

    def warm_up(self) -> Any:
        first = slice(0, self.cfg.dataset.batch_size)  # a step off the clock: set-up
        sample = (self.job.splits.x_train[first], self.job.splits.y_train[first])
        return gradient(self.net.forward, self.net.params, sample, self.net.device)

    def run(self) -> Op[None]:
        world, reply, push = self.world, self.reply, self.push
        pushed_at = world.now()
        while True:
            yield from world.recv(self.inbox, 0, patient=self.spare and self.worker < 0)
            received = world.now()
            kind, version, clock, index, batch, started_at = REPLY.unpack_from(reply.raw)
            if kind == STOP:
                return None
            if self.worker < 0 or self.joined is not None:  # the first reply: who it is
                if self.joined != (index, clock, started_at):
                    self.join(index, clock, started_at)
                self.joined = None
                pushed_at = received if self.spare else pushed_at
            world.strike(self.pause)
            # the gradient goes into the push, which the simulator computes once it is read
            _, compute = yield from world.compute(self.step, self.step_s(batch), lazy=True)
            SENT.pack_into(push.raw, 0, self.clock, version)
            TIMES.pack_into(push.raw, 16, compute, received - pushed_at)
            pushed_at = world.now()
            yield from world.send(self.out, 0)
            self.clock += 1

    def join(self, worker: int, clock: int, started_at: float) -> None:
        """Worker `worker` from step `clock` and run time `started_at` (a resumed run's
        worker, a spare in a lost worker's place: where that worker was)."""
        self.worker, self.clock, profile = worker, clock, self.profile
        self.joined = (worker, clock, started_at)
        self.world.play(worker, started_at, clock, replaced=self.spare)
        self.batches = self.batches or self.job.batches(worker)
        catch_up(profile, worker, self.batches, clock)
        # a step: the gradient at the θ just received, on the next minibatch, into the push
        self.step = GradientStep(
            self.net,
            self.reply.payload,
            self.buffers,
            self.batches,
            self.push.payload,
            self.pushed,
            self.scale,
        )

    def pause(self, at: float, seconds: float) -> None:
        self.world.events.emit("worker", at, worker=self.worker, event="pause", duration_s=seconds)

    def step_s(self, batch: int) -> float:
        """The profile's time for this step, and its minibatch size (a barrier may re-assign
        it: DBS; the profile's time is for dataset.batch_size samples)."""
        step_s, size = self.profile.step_s(self.worker), self.cfg.dataset.batch_size
        if batch and batch != size:
            step_s *= batch / size
        if batch and batch != self.batches.size:
            self.batches.size = batch
        return step_s

    def pushed(self, grad: torch.Tensor, loss: float) -> None:
        """The push of a step's gradient at θ (`step`): the gradient, or what the rule makes
        of it on the worker, and the minibatch's loss."""
        push = self.push
        LOSS.pack_into(push.raw, 8, loss)
        message = self.rule.worker_message(self.cfg.algorithm.update, grad, self.rule_state)
        if message is not grad:
            push.payload.copy_(message)

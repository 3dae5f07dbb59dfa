"""The parameter server in the real runtime: rank 0 serves (the loop of `loop.serve`, fed
by a receiver thread per worker), ranks 1..N are workers, the ranks after them spares that
wait, ready, until a lost worker's place is theirs.

Wire format: one float32 tensor per message, HEADER slots then a model-sized payload.
Integer header slots are written through an int32 view, so clocks and versions are exact.
"""

from __future__ import annotations

import logging
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stalebench.algorithms.base import UPDATES
from stalebench.engines.ps.loop import build_server, serve
from stalebench.engines.ps.state import Push
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.runtime import checkpoint
from stalebench.runtime.faults import Faults, Shaped, WorkerLost, pad_to
from stalebench.runtime.receiver import Inbox
from stalebench.runtime.record import RunRecord, flatten_parameters, gradient
from stalebench.runtime.transport import Transport

log = logging.getLogger("stalebench")

HEADER = 8  # float32 slots before the payload of every message
# int slots: 0 kind, 1 clock (push) / version (reply), 2 version read (push) / the
# worker's clock (reply: a resumed run's workers start at their checkpointed clocks)
# float slots: 3 loss (push) / the run time the worker's rank started at (reply: when this
# server started, or a spare joined), 4 compute_s (push) / int: the worker's index (reply),
# 5 rtt_s (push) / int: the minibatch size of the step (reply), 6 paused_s, 7 whether the
# worker keeps state of its own (push)
PUSH, PARAMS, STOP = 1, 2, 3
SPARE_WAIT = timedelta(days=1)  # a spare waits for a place as long as the run lasts


def message_bytes(num_params: int) -> int:
    """Size of one push or pull on the wire."""
    return 4 * (HEADER + num_params)


class Header:
    """A message's header slots as numpy views of its (CPU) buffer: float slots `f`, int
    slots `i`; each slot read or written without a torch operation."""

    def __init__(self, buf: torch.Tensor):
        self.f = buf[:HEADER].numpy()
        self.i = self.f.view(np.int32)


class Server:
    """Rank 0: the `serve` loop's port over gloo. It also reports the workers' pauses,
    tells the workers still computing to stop once the run has ended, and writes the run
    directory."""

    def __init__(self, job: Job, run_dir: Path, transport: Transport):
        cfg = job.cfg
        self.job, self.cfg, self.transport = job, cfg, transport
        self.n = job.num_workers
        resume = checkpoint.load(run_dir) if cfg.resume else None
        self.record = RunRecord(job, run_dir, resume=resume)
        self.model, self.ps = build_server(job, self.record.events.emit)
        self.started_at, self.bytes_before = 0.0, 0  # run time and bytes before this process
        if resume:
            self.ps.resume(resume["state"]["ps"])
            self.started_at, self.bytes_before = resume["t"], resume["state"]["bytes_sent"]
        self.worker_state = False  # a worker keeps state a checkpoint cannot hold
        size, ranks = HEADER + self.ps.params.numel(), range(1, self.n + 1 + cfg.cluster.spares)
        # a mailbox each way per rank: a push is read in place until the reply to it
        self.pushes = {r: transport.mailbox(r, 0, size, HEADER) for r in ranks}
        self.replies = {r: transport.mailbox(0, r, size, HEADER) for r in ranks}
        make = lambda rank: [self.pushes[rank]]  # noqa: E731
        self.inbox = Inbox(transport, self.n, make, self.now, cfg.timeout_s)
        self.receivers = self.inbox.receivers
        self.active = set(range(self.n))  # workers not yet sent STOP
        self.rank = list(range(1, self.n + 1))  # each worker's rank: a spare's once replaced
        self.spares = list(range(self.n + 1, self.n + 1 + cfg.cluster.spares))
        self.joined_at: dict[int, float] = {}  # run time a spare took a worker's place

    def run(self) -> dict[str, Any]:
        status, error = "completed", None
        self.t0 = time.perf_counter()
        try:
            self.inbox.start()
            self.stop(set(self.ps.lost))  # a resumed run: the workers lost before stay out
            status = serve(self.ps, self, self.record, self.cfg.budget, self.started_at)
            while self.active:  # a push that crossed our decision to stop: discard it
                try:
                    w, _ = self._next(0.0)
                except WorkerLost as lost:  # lost after the run ended: nothing to undo
                    log.warning("server: after the end, %s", lost)
                    self.forget(lost.worker)
                    continue
                self.stop({w})
        except Exception as exc:
            status, error = "failed", str(exc)
            log.error("server: %s\n%s", exc, traceback.format_exc())
            self.stop(set(self.ps.held))
        self._stop_ranks(self.spares)  # the spares never needed
        return self.record.finish(
            self.model,
            self.ps.params,
            self.ps.version,
            self.now(),
            status,
            error,
            bytes_sent=self.bytes_before + self.transport.bytes_sent,
        )

    def now(self) -> float:
        return self.started_at + time.perf_counter() - self.t0

    def checkpoint(self) -> None:
        t, checkpoints = self.now(), self.record.checkpoints
        if not checkpoints.due(t):
            return
        if self.worker_state:  # e.g. DANA-Slim's momentum, on the workers: none is saved
            log.warning("server: the workers keep state of their own: no checkpoints")
            checkpoints.every_s = 0.0
            return
        state = {"ps": self.ps.state(), "bytes_sent": self.bytes_before + self.transport.bytes_sent}
        checkpoints.save(t, self.ps.version, state)

    def next_push(self) -> Push | None:
        item = self._next(self.cfg.budget.max_wall_s)
        if item is None:
            return None
        w, (buf,) = item
        h = Header(buf)
        if int(h.i[0]) != PUSH:
            raise RunError(f"worker {w} sent message kind {int(h.i[0])}, expected a push")
        self.worker_state |= bool(h.f[7])
        if h.f[6] > 0:
            self.record.events.emit(
                "worker", self.now(), worker=w, event="pause", duration_s=float(h.f[6])
            )
        return Push(
            worker=w,
            clock=int(h.i[1]),
            version_read=int(h.i[2]),
            grad=buf[HEADER:],
            loss=float(h.f[3]),
            compute_s=float(h.f[4]),
            rtt_s=float(h.f[5]),
        )

    def _next(self, max_wall_s: float):
        return self.inbox.next(self.active, max_wall_s)

    def send(self, replies) -> None:
        for r in replies:
            w, out = r.worker, self.replies[self.rank[r.worker]]
            h = Header(out)
            h.i[:3] = PARAMS, r.version, self.ps.clocks[w]
            h.f[3] = self.joined_at.get(w, self.started_at)
            h.i[4], h.i[5] = w, r.batch
            out[HEADER:] = r.params
            try:
                self.transport.send(out, self.rank[w])
            except RunError as exc:  # it died since its push: its receiver reports the loss
                log.warning("server: %s", exc)
            self.receivers[w].arm(self.now())

    def forget(self, worker: int) -> None:
        self.active.discard(worker)
        self.receivers[worker].close()

    def replace(self, worker: int) -> str | None:
        if not self.spares:
            return None
        rank = self.spares.pop(0)
        self.rank[worker], self.joined_at[worker] = rank, self.now()
        self.inbox.replace(worker, rank)
        self.active.add(worker)
        return f"spare {rank - 1 - self.n} (rank {rank})"

    def stop(self, waiting: set[int]) -> None:
        """Tell the workers waiting for a reply to stop; the others (still computing) are
        told at their next push."""
        for w in sorted(waiting & self.active):
            self.active.discard(w)
            self.receivers[w].close()
            if self._stop_ranks([self.rank[w]]):
                self.record.events.emit("worker", self.now(), worker=w, event="stop")

    def _stop_ranks(self, ranks: list[int]) -> bool:
        stopped = True
        for rank in ranks:
            out = self.replies[rank]
            Header(out).i[:3] = STOP, self.ps.version, 0
            try:
                self.transport.send(out, rank)
            except Exception as exc:  # best effort on the failure path
                log.warning("could not stop rank %d: %s", rank, exc)
                stopped = False
        return stopped


def work(job: Job, rank: int, transport: Transport) -> None:
    """Rank r ≤ N, worker r − 1: read θ, compute a gradient on the next minibatch of its
    shard, last the profile's step time, push it with the version read; until told to stop.
    The profile's network delays are paid by the transport, its faults when a step starts.
    A rank after the N workers is a spare: set up, it waits (past timeout_s) for the place
    of a lost worker — its index, clock and the run time come in its first reply — or for
    the end of the run."""
    cfg, profile = job.cfg, job.profile
    spare = rank > job.num_workers
    transport = Shaped(transport, profile)
    device = job.device(rank - 1)
    model = job.model().to(device)
    size = HEADER + sum(p.numel() for p in model.parameters())
    inbox, out = transport.mailbox(0, rank, size, HEADER), transport.mailbox(rank, 0, size, HEADER)
    head, sent = Header(inbox), Header(out)
    in_place = device.type == "cpu"  # θ arrives in the model's own parameters
    flat = flatten_parameters(model, inbox[HEADER:] if in_place else None)
    params = list(model.parameters())
    batches = None if spare else job.batches(rank - 1)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    rule_state: dict = {}  # the update rule's worker-side state (e.g. DANA-Slim's momentum)
    # One throwaway step before t = 0, so first-call set-up is not timed as compute.
    warmup = slice(0, cfg.dataset.batch_size)
    gradient(model, params, (job.splits.x_train[warmup], job.splits.y_train[warmup]), device)
    clock, pushed_at, t0 = 0, None, None
    while True:
        transport.recv(inbox, 0, SPARE_WAIT if spare and t0 is None else None)
        received = time.perf_counter()
        kind, version = int(head.i[0]), int(head.i[1])
        if kind == STOP:
            return
        if t0 is None:  # the first reply: who it is, its clock, the run time it starts at
            t0, clock, started_at = received, int(head.i[2]), float(head.f[3])
            worker = int(head.i[4])
            batches = batches or job.batches(worker)
            # (0 and 0 unless resumed or replaced: a spare starts where the lost worker was)
            faults = Faults(profile, worker, started_at, clock, replaced=spare)
            transport.faults = faults  # a slow fault delays the worker's pushes
            _skip(batches, profile, worker, clock)
        now = started_at + received - t0
        paused = faults.strike(now, lambda at, s, w=worker: _pause(w, at, s)) - now
        size = int(head.i[5])
        if size != batches.size:  # the server re-assigned the minibatch sizes (DBS)
            batches.size = size
        start = time.perf_counter()
        if not in_place:
            flat.copy_(inbox[HEADER:])
        grad, loss_value = gradient(model, params, next(batches), device, out[HEADER:])
        message = rule_cls.worker_message(cfg.algorithm.update, grad, rule_state)
        if message is not grad:
            out[HEADER:] = message
        target_s = profile.step_s(worker)  # the profile's slowness, beyond real compute
        if size != cfg.dataset.batch_size:  # its time is for dataset.batch_size samples
            target_s *= size / cfg.dataset.batch_size
        pad_to(start, target_s)
        compute = time.perf_counter() - start
        rtt = received - pushed_at if pushed_at is not None else 0.0
        sent.i[:3] = PUSH, clock, version
        sent.f[3:8] = loss_value, compute, rtt, paused, float(bool(rule_state))
        pushed_at = time.perf_counter()
        transport.send(out, 0)
        clock += 1


def _skip(batches, profile, worker: int, steps: int) -> None:
    """A resumed worker's data stream and step times, moved on past the steps it took
    before the checkpoint, so it reads the batches an uninterrupted run would."""
    for _ in range(steps):
        next(batches)
        profile.step_s(worker)


def _pause(worker: int, at: float, seconds: float) -> None:
    log.warning("worker %d: injected fault pause at %.3f s", worker, at)
    time.sleep(seconds)

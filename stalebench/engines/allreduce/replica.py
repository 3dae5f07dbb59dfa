"""engine=allreduce's replica, one role for both runtimes (the engine, its config and
checks: `stalebench.engines.allreduce`, which imports no torch).

A replica keeps θ, its net (whose parameters are views of θ) and the update rule's state
on its device, and takes the update there; the round's message is in host memory (pinned
on a GPU), the gradient copied into it and the mean copied back, each `non_blocking`.

The protocol, a round at a time: every replica computes its gradient, writes its statistics
(compute time, loss, seconds paused) and rank 0 its order (stop, save, or go on) into the
header of one message, and all-reduces it with the gradient — in one message, or with
engine.bucket_mb in pieces as backward makes them (`Rounds`; P3: applied by layer in the
next round's forward pass). Each replica then takes the mean gradient's step, and rank 0
reports the round. The order rank 0 decides in a round travels in the next: that round is
not applied (stop), or every rank saves its part of a checkpoint after it (save), and it
may invite the ranks standing by into vacant places, to join after it (`Members.offer`). A
spare (a rank after the N replicas), or a replica left out and back, stands by until it
takes a lost replica's place.
"""

from __future__ import annotations

from typing import Any

import torch

from stalebench import precision
from stalebench.engines.allreduce.hybrid import Hybrid
from stalebench.engines.common import GradientStep, Net, catch_up, compiled
from stalebench.engines.overlap import Rounds, build_replica, measure_step
from stalebench.engines.rounds import close_round, ring_volume, round_slots
from stalebench.job import Job
from stalebench.models.nets import flatten_parameters
from stalebench.runtime.driver import Ending, Role
from stalebench.runtime.members import Members
from stalebench.runtime.record import gradient
from stalebench.runtime.wire import Message
from stalebench.runtime.world import Op, World

# rank 0's order in a round's last slot: this round is not applied; a checkpoint after it
STOP, SAVE = 1.0, 2.0


class Replica(Role):
    """One replica's rank: its model, θ and update rule, and the round it is at."""

    def __init__(self, job: Job, world: World):
        self.job, self.world, self.n = job, world, job.num_workers
        self.device = world.device
        self.model, self.params, self.rule, self.net, self.net_params = build_replica(
            job, self.device
        )
        self.status, self.stop, self.save, self.looping = "completed", False, False, False
        self.stands_by = world.rank >= self.n  # a spare
        self.progress: dict[str, Any] = {"version": 0, "bytes": 0}  # every worker in
        self.t_last = 0.0  # when the last round closed (rank 0)

    def warm_up(self) -> Any:
        x, y = self.job.splits.x_train[:1], self.job.splits.y_train[:1]
        return gradient(compiled(self.job, self.net), self.net_params, (x, y), self.device)

    def start(self) -> None:
        """Round 0: θ₀ and the rule as built; worker `rank` plays."""
        self.world.play(self.world.rank)

    def evaluated(self) -> Any:
        return self.params

    def load(self, part: dict[str, Any]) -> None:
        """A resumed run's replica: θ, the rule and the rounds as its checkpoint saved them
        (its faults are the world's, as they were)."""
        self.join(part)
        self.t_last = self.world.now()  # the checkpoint's time

    def take_over(self, state: dict[str, Any]) -> bool:
        """A spare, a replica back (or a resumed run's rank that took no part) in a lost
        replica's place: θ and the rule as the replicas left sent them; that replica's
        faults after it joins."""
        self.join(state)
        spare = self.stands_by or self.looping  # a spare, or a replica back: mid-run
        worker = state["progress"]["workers"][self.world.rank]
        self.world.play(worker, self.world.now() if spare else 0.0,
                        state["progress"]["version"], spare)  # fmt: skip
        return True

    def join(self, state: dict[str, Any]) -> None:
        """θ (its net's parameters views of it), the rule and the rounds so far from a
        checkpoint's part or the replicas left."""
        self.params, self.rule, self.progress = state["params"], state["rule"], state["progress"]
        if not self.params.is_meta:  # a cost-only run's θ has no values
            sent = self.params.clone()
            flatten_parameters(self.net, self.params)  # the net's parameters views of θ
            self.params.copy_(sent)

    def run(self) -> Op[Ending | None]:
        yield from self.set_up()
        self.looping = True
        while (yield from self.round()):
            pass
        if self.overlap is not None:
            self.overlap.pieces.close()  # a peer lost at the last piece fails the run
        return self.ending()

    def fail(self, exc: Exception) -> Op[Ending | None]:
        """What is still under way is abandoned (waiting would raise again); the replicas
        lost in the failing round are logged."""
        if not self.looping:
            raise exc
        self.t_last = self.world.now()
        self.members.failed(exc, self.version + 1, self.t_last)
        return self.ending()
        yield  # unreachable: an op

    def ending(self) -> Ending:
        return Ending(self.model, self.params, self.version, self.t_last, self.status,
                      bytes_sent=self.bytes_sent)  # fmt: skip

    def set_up(self) -> Op[None]:
        """The round's message (its header: each replica's statistics, then rank 0's order;
        then the gradient — no values in a cost-only run), the worker this rank plays and
        its step; with engine.bucket_mb, the rounds in pieces."""
        job, world, n, params, rule = self.job, self.world, self.n, self.params, self.rule
        progress = self.progress
        self.members = Members(job, world, progress.get("workers"), progress.get("live"))
        self.worker = self.members.me
        header_slots = 3 * n + 1  # the statistics, then the order
        payload_slots = round_slots(params.numel(), n) - header_slots
        self.msg = Message(header_slots, payload_slots, job.numerics, world.device.type == "cuda")
        # θ on a GPU: the mean gradient copied up from the message into one buffer
        payload = self.msg.payload
        same = payload.device == params.device or payload.is_meta
        self.grad_in = None if same else torch.empty_like(params)
        self.step = worker_of(job, world, self.net, params, self.worker, progress["version"],
                              self.msg.payload)  # fmt: skip
        eng = job.cfg.engine
        self.hybrid = None  # engine.model_parallel: layers split over the ranks
        if eng.model_parallel:
            self.hybrid = Hybrid.of(self.net, list(eng.model_parallel), job.cfg.dataset.batch_size)
        kept = self.hybrid.tensors if self.hybrid is not None else frozenset()
        self.p3, self.overlap, nominal = eng.schedule == "p3", None, 1.0
        if eng.bucket_mb:
            if self.p3:
                nominal = yield from measure_step(job, world, self.net, self.net_params)
            self.overlap = Rounds(job, world, self.step, params, rule, nominal, self.msg,
                                  self.grad_in, kept)  # fmt: skip
            self.step = self.overlap.step if self.overlap.pieces.hooked else self.step
        self.hooked = self.overlap is not None and self.overlap.pieces.hooked
        # the slots the protocol reads, as numpy: no tensor op a scalar
        self.header = self.msg.head.numpy()
        self.stats = self.header[: 3 * n].reshape(n, 3)
        self.order = self.header[3 * n :]
        self.version, self.bytes_sent = progress["version"], progress["bytes"]

    def round(self) -> Op[bool]:
        """One round; False once rank 0's order stops the rounds (that round not applied)."""
        world, overlap = self.world, self.overlap
        paused = world.strike()  # a pause stalls the round
        step_s = self.job.profile.step_s(self.worker)  # the round's draw from its stream
        if self.hybrid is not None:  # the model-parallel layers' exchanges stand in its way
            step_s += self.hybrid.seconds(world.exchange_s)
        closing = overlap.next_round(step_s) if overlap is not None else None
        if closing is not None and self.order[0] == STOP:  # P3: read from the round before
            return False
        loss, compute = yield from world.compute(self.step, step_s)
        if closing is not None:  # P3: the forward pass applied the round before
            waited = overlap.pieces.waited - overlap.mark
            compute -= waited
            self.close(closing, waited, float(closing[0, 0]))
        self.header[:] = 0.0
        self.stats[self.worker] = compute, loss, paused
        order = STOP if self.stop else SAVE if self.save else 0.0  # the others': 0
        self.order[0] = order if self.p3 else self.members.offer(order)
        reduce_start = world.now()
        if overlap is not None:
            overlap.header_written()  # it completes the first piece
        if self.p3 and self.hooked:  # on a virtual clock: one all-reduce, the forward's wait
            return True
        yield from self.reduce(compute)
        self.order[0] = self.members.heard(float(self.order[0]))
        if self.order[0] == STOP:  # rank 0 decided last round that this one is not applied
            return False
        if self.job.numerics:  # a cost-only run takes no update's arithmetic
            self.rule.step(self.params, self.mean_gradient(), -1, 0)
        self.close(self.stats, world.now() - reduce_start, compute)
        yield from self.after_round()
        return True

    def reduce(self, compute: float) -> Op[None]:
        """The round's message summed over the replicas (over those left, once some are
        lost: cluster.min_replicas): the network's ring time, or gloo's."""
        world, overlap, msg = self.world, self.overlap, self.msg
        if self.hooked:  # the pieces went as backward made them
            yield from overlap.pieces.settle()
            return
        lasts = overlap.pieces.comm_s(compute, world.faults.slow_s) if overlap else None
        nbytes = msg.nbytes
        if self.hybrid is not None:  # the model-parallel layers' gradients stay
            whole = nbytes if nbytes is not None else msg.buf.numel() * msg.buf.element_size()
            nbytes = whole - 4 * self.hybrid.elements
        live = yield from self.members.summing(msg.buf, lasts, nbytes=nbytes)
        self.members.left(self.version + 1, live)

    def mean_gradient(self) -> Any:
        """The round's summed gradient over the replicas in it, on θ's device."""
        grad = self.msg.payload.div_(len(self.members.live))
        return grad if self.grad_in is None else self.grad_in.copy_(grad, non_blocking=True)

    def close(self, round_stats, reduce_s: float, own: float) -> None:
        """The round is in θ: rank 0 reports it and decides the stop."""
        self.version += 1
        live = self.members.live
        self.bytes_sent += ring_volume(self.msg.size, len(live))
        record = self.world.record
        if record is not None:
            self.t_last = self.world.now()
            bad, spent_ = close_round(record, self.t_last, self.version, round_stats, reduce_s,
                                      own, self.params, live)  # fmt: skip
            self.status = "diverged" if bad else self.status
            self.stop = self.stop or bad or spent_

    def after_round(self) -> Op[None]:
        """Spares chosen by the round take the lost replicas' places; a checkpoint when
        rank 0's order said so (not after a round that welcomed spares, which would take no
        part: it stays due); rank 0 decides whether the next round's order is save."""
        world, welcomed = self.world, bool(self.world.joining)
        if welcomed:  # from the next round
            self.members.take_in_spares()
            yield from world.welcome(self.state())
        if self.order[0] == SAVE and not welcomed:  # every rank, at once
            yield from world.checkpoint(self.version, self.state(), world.now())
        self.save = (world.record is not None and not self.stop
                     and world.checkpoint_due(world.now()))  # fmt: skip

    def state(self) -> dict[str, Any]:
        """What a spare joining, or this rank's part of a checkpoint, holds: θ, the update
        rule, and where the rounds are (`place`)."""
        members = self.members
        progress = {"version": self.version, "live": members.live, "workers": members.workers,
                    "bytes": self.bytes_sent}  # fmt: skip
        return {"params": self.params, "rule": self.rule, "progress": progress}


def worker_of(job: Job, world: World, net, params, worker: int, version: int, out):
    """`worker`'s step (the gradient at θ into `out`, its loss the result; the net's
    parameters are views of θ: no copy), from round `version` on."""
    device, profile = world.device, job.profile
    batches = job.batches(worker)
    catch_up(profile, worker, batches, version)
    own = Net(job, device, net, params)
    scale = precision.loss_scale(device)  # fp16: the replica's own loss scale
    return GradientStep(own, params, own.buffers, batches, out, lambda grad, loss: loss, scale)

"""engine=local's collective modes (sync, streaming, overlap): one role per worker, the same
in both runtimes (`stalebench.runtime.world`); the asynchronous mode's roles: `server`.

The protocol, step by step as `Plan` says: every worker takes its inner steps; a fragment's
send starts two collectives over the workers — the payload (the wire's Δ, all-reduced; int8:
all-gathered) and the statistics since the last send (float64, exact: `STATS` per worker,
and when its payload is through, as the profile prices it) — and the fragment's merge waits
for them and applies the outer step. In sync mode the merge follows the send at once; with
engine.delay the collectives run while the inner steps go on. A rule that follows leaders
all-reduces the losses first, to choose them (sync mode only).

No message decides the stop: every rank decides it from what all share after a merge (the
outer steps, the losses, θ, the latest priced end of an exchange, which the wall budget is
checked against), so all stop after the same merge; a checkpoint (engine.delay=0), the
same way. Rank 0 reports each round and writes the run directory. A spare (a rank after the
M workers) stands by until it takes a lost worker's place: the workers left send it θ, the
outer rules and an inner optimizer after a merge, and it runs that worker's rounds.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import torch

from stalebench import placement
from stalebench.engines.common import Net, catch_up
from stalebench.engines.local.round import (
    STATS,
    Exchange,
    Plan,
    Replica,
    Wire,
    report,
    segments,
    stats_row,
)
from stalebench.job import Job
from stalebench.runtime.driver import Ending, Role
from stalebench.runtime.members import Members
from stalebench.runtime.record import diverged, gradient, spent
from stalebench.runtime.world import Op, World


@dataclasses.dataclass
class Sent:
    """A fragment's exchange under way: its buffers, this worker's Δ, the collectives."""

    payload: torch.Tensor | list[torch.Tensor]  # the sum, or (int8) every worker's piece
    stats: torch.Tensor
    delta: torch.Tensor
    pending: list[Any]
    waited_s: float  # seconds the send itself waited (a leaders exchange runs in full)
    steps: int


class Member(Role):
    """One worker: its replica, θ (the same on every rank), the fragments' exchanges, and
    the collectives under way."""

    def __init__(self, job: Job, world: World):
        engine, rank = job.cfg.engine, world.rank
        self.job, self.world, self.rank, self.engine = job, world, rank, engine
        self.num_workers = job.num_workers
        self.net = world.shared("net", lambda: Net(job, world.device))
        self.stands_by = rank >= self.num_workers  # a spare (cluster.spares)
        self.looping = False  # in the rounds: an error there fails the run
        if not self.stands_by:
            self.seat()

    def seat(self, state: dict[str, Any] | None = None) -> None:
        """The worker this rank plays, its replica and the fragments' exchanges: as the run
        starts, or where the replicas left are (`state`: a spare's welcome, or this rank's
        part of a checkpoint)."""
        job, world, engine, net = self.job, self.world, self.engine, self.net
        # θ₀, the same on every rank, on its device (the replica's, the outer rules' too)
        self.theta = net.flat.detach().clone()
        # who plays which worker (a spare: the one whose place it takes), those left: as
        # the run starts, or where the replicas left are (a spare joining, or resumed)
        self.members = Members(job, world, *((state["workers"], state["live"]) if state else ()))
        self.status, self.version, self.nbytes = "completed", state["version"] if state else 0, 0
        self.worker = self.members.me
        self.replica = Replica(job, self.worker, self.theta, net)
        self.plan = Plan(engine.mode, job.cfg.algorithm.outer.inner_steps, engine.fragments,
                         engine.delay, self.theta.numel())  # fmt: skip
        # each fragment's slice of θ, and its exchange (its outer rule and wire)
        self.parts = [self.plan.part(fragment) for fragment in range(self.plan.fragments)]
        sizes = [p.numel() for p in net.params]
        self.exs = [
            Exchange(job, self.theta[part], Wire(engine.quantize, segments(sizes, part)))
            for part in self.parts
        ]
        self.sent: dict[int, Sent] = {}  # by fragment
        self.compute, self.paused, self.losses = 0.0, 0.0, []  # since the last send
        self.step, self.merged_t = 0, 0.0  # inner steps taken; see merge
        self.welcomed = False  # this step's merge welcomed ranks (no checkpoint after it)

    def start(self) -> None:
        self.world.play(self.worker)

    def evaluated(self) -> torch.Tensor:
        return self.theta

    def load(self, part: dict[str, Any]) -> None:
        self.seat(part)
        self.restore(part)

    def take_over(self, state: dict[str, Any]) -> bool:
        """A spare (or a resumed run's rank that took no part) in a lost worker's place: θ,
        the outer rules and the inner optimizer (over its replica) as the replicas left sent
        them; its predecessor's minibatches, step times and later faults from the steps
        they took."""
        self.seat(state)
        job, replica, steps = self.job, self.replica, state["steps"]
        self.theta, self.exs, replica.x, replica.inner, self.step = (
            state["theta"],
            state["exs"],
            state["x"],
            state["inner"],
            steps,
        )
        self.world.play(self.worker, self.world.now(), steps, replaced=True)
        catch_up(job.profile, self.worker, replica.batches, steps)
        return True

    def warm_up(self) -> Any:
        warm = (self.job.splits.x_train[:1], self.job.splits.y_train[:1])
        return gradient(self.net.forward, self.net.params, warm, self.net.device)

    def run(self) -> Op[Ending | None]:
        return (yield from self.rounds())

    # what a rank's checkpoint holds: its replica's state, θ and the outer rules, where the
    # rounds are, the statistics since its last send
    KEPT = ("theta", "exs", "version", "nbytes", "step", "compute", "paused", "losses")

    def checkpoint(self) -> Op[None]:
        """Every rank at the end of the same step, no exchange in flight (engine.delay=0):
        its part of a checkpoint set (`World.checkpoint`)."""
        replica, members = self.replica, self.members
        part = {key: getattr(self, key) for key in self.KEPT}
        part.update(x=replica.x, inner=replica.inner, buffers=replica.buffers,
                    workers=members.workers, live=members.live)  # fmt: skip
        yield from self.world.checkpoint(self.version, part, self.merged_t)

    def restore(self, part: dict[str, Any]) -> None:
        """A resumed run's rank: its part of the checkpoint set; its minibatches and step
        times from the steps it took."""
        for key in self.KEPT:
            setattr(self, key, part[key])
        replica = self.replica
        replica.x, replica.inner, replica.buffers = part["x"], part["inner"], part["buffers"]
        catch_up(self.job.profile, self.worker, replica.batches, self.step)

    def rounds(self) -> Op[Ending | None]:
        """Inner steps, sends and merges as the plan says, until the run stops."""
        self.looping, stop = True, False
        while self.status == "completed" and not stop:
            stop = yield from self.inner_step()
        for sent in self.sent.values():  # started by every rank: finish them before leaving
            for handle in sent.pending:
                yield from self.world.complete(handle)
        return self.ending()

    def inner_step(self) -> Op[bool]:
        """One inner step, then the sends and merges it is due; whether the run stops."""
        world, replica, plan, stop = self.world, self.replica, self.plan, False
        if self.step % plan.steps == 0:
            replica.inner.new_round()
        self.paused += world.strike()
        inner = replica.step(self.net)  # the step to compute (`self.step`: the steps taken)
        loss, compute_s = yield from world.compute(inner, self.job.profile.step_s(self.worker))
        self.losses.append(loss)
        self.compute += compute_s
        self.step += 1
        if plan.delay == 0:  # a merge follows its send at once
            yield from self.send(plan.sends(self.step))
        merges = plan.merges(self.step)
        for fragment in merges:
            stop = (yield from self.merge(fragment)) or stop
        if plan.delay > 0 and not stop:  # earlier sends merged first, then this step's
            yield from self.send(plan.sends(self.step))
        elif merges and self.keeps_checkpoints(stop):
            yield from self.checkpoint()
        return stop

    def fail(self, exc: Exception) -> Op[Ending | None]:
        """The replicas lost in the failing round are logged."""
        if not self.looping:
            raise exc
        self.members.failed(exc, self.version + 1, self.world.now())
        return self.ending()
        yield  # unreachable: an op

    def ending(self) -> Ending:
        for kept, last in zip(self.net.buffers, self.replica.buffers, strict=True):
            kept.copy_(last)  # its BatchNorm statistics (rank 0's, for the evaluation)
        return Ending(self.net.model, self.theta, self.version, self.world.now(), self.status,
                      bytes_sent=self.nbytes)  # fmt: skip

    def send(self, fragments: list[int]) -> Op[None]:
        """Start the exchanges of `fragments`, with the statistics since the last send: the
        payload (for a rule that follows leaders, the losses first, to choose them), then
        the statistics with when this worker's payload is through — the harness's own
        exchange, free on the wire (`seconds=0.0`) and in no byte count."""
        world, num_workers, worker = self.world, self.num_workers, self.worker
        for fragment in fragments:
            exchange, part = self.exs[fragment], self.parts[fragment]
            delta = self.theta[part] - self.replica.x[part]
            row = stats_row(self.compute, statistics.fmean(self.losses), self.paused, delta,
                            exchange.wire)  # fmt: skip
            waited, pending = 0.0, []
            # cluster.min_replicas (a mean, never int8): over the replicas left
            reduce = self.members.all_reduce
            if exchange.rule.exchange == "leaders":  # the losses first, to choose the leaders
                losses = torch.zeros(num_workers, dtype=torch.float64)
                losses[worker] = row[1]
                waited += yield from world.all_reduce(losses)
                exchange.choose(losses.tolist())
                payload = placement.on_host(exchange.contribution(worker, delta))
                waited += yield from world.all_reduce(payload, nbytes=exchange.payload_bytes)
            else:
                payload = placement.on_host(exchange.contribution(worker, delta))  # for gloo
                if exchange.gathers:  # int8: every worker's piece, summed after decoding
                    pieces = [torch.empty_like(payload) for _ in range(num_workers)]
                    handle = yield from world.all_gather(
                        pieces, payload, wait=False, nbytes=exchange.payload_bytes
                    )
                    payload = pieces
                else:
                    handle = yield from reduce(payload, wait=False, nbytes=exchange.payload_bytes)
                pending.append(handle)
            row.append(world.collectives_end())  # when its payload is through, as modelled
            row.append(self.members.offer(0.0))  # rank 0 may invite ranks standing by
            stats = torch.zeros(num_workers, STATS + 2, dtype=torch.float64)
            stats[worker] = torch.tensor(row, dtype=torch.float64)
            pending.insert(0, (yield from reduce(stats, 0.0, wait=False)))
            self.sent[fragment] = Sent(payload, stats, delta, pending, waited, len(self.losses))
            self.compute, self.paused, self.losses = 0.0, 0.0, []

    def merge(self, fragment: int) -> Op[bool]:
        """Wait for `fragment`'s exchange and apply it; True when the run is to stop."""
        sent, exchange = self.sent.pop(fragment), self.exs[fragment]
        part, theta, num_workers = self.parts[fragment], self.theta, self.num_workers
        blocked = sent.waited_s
        for handle in sent.pending:
            blocked += yield from self.world.complete(handle)
        live = self.members.of(sent.pending[-1])  # the replicas the payload summed
        self.members.left(self.version + 1, live)
        self.members.heard(float(sent.stats[:, STATS + 1].sum()))  # they join after it
        rows = sent.stats[live, :STATS]
        if self.job.numerics:  # a cost-only run takes no outer step's arithmetic
            before = theta[part].clone() if self.plan.keeps_progress else None
            leaders = exchange.new_theta(theta[part], sent.payload, num_workers / len(live))
            exchange.merge(self.replica.x[part], sent.delta, theta[part], leaders, self.worker,
                           before, self.engine.alpha)  # fmt: skip
        self.version += 1
        volume = exchange.volume()
        self.nbytes += volume
        record = self.world.record
        if record is not None:
            t, busy = self.world.now(), rows[:, 0] + rows[:, 2]
            comm = max(blocked - (float(busy.max()) - float(busy[0])), 0.0)
            report(record.events.emit, t, self.version, rows.tolist(), comm, sent.steps,
                   volume // num_workers, live)  # fmt: skip
            record.snapshots.maybe(t, self.version, theta)
        if self.job.numerics and diverged(float(rows[:, 1].sum()), theta):
            self.status = "diverged"
        self.merged_t = float(sent.stats[:, STATS].max())  # the same on every rank
        stop = spent(self.job.cfg.budget, self.version, self.merged_t)
        if self.world.joining and not stop:  # spares take the lost places from the next round
            yield from self.welcome()
        return stop

    def keeps_checkpoints(self, stop: bool) -> bool:
        """After a step's merges (engine.delay=0: nothing left in flight): whether every
        rank checkpoints here, decided from what all share — a checkpoint due by the
        merged round's time, the run going on, and no rank joining after this step (it would
        take no part)."""
        welcomed, self.welcomed = self.welcomed, False
        due = self.world.checkpoint_due(self.merged_t)
        return not stop and not welcomed and self.status == "completed" and due

    def welcome(self) -> Op[None]:
        """The replicas left hand θ, the outer rules and an inner optimizer to the spares
        chosen (rank 0 logs each `replaced`)."""
        members, self.welcomed = self.members, True
        members.take_in_spares()
        yield from self.world.welcome({
            "theta": self.theta, "exs": self.exs, "x": self.replica.x,
            "inner": self.replica.inner,
            "workers": members.workers, "live": members.live, "version": self.version,
            "steps": self.step,  # every worker's inner steps (a merge ends them all)
        })  # fmt: skip

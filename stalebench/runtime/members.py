"""Who is in a run's rounds, owned once for every engine whose ranks meet in collectives
(all-reduce rounds, local SGD's merges, gossip's meetings).

Each rank plays a worker (`workers`: rank → worker index; -1 for a spare standing by or a
lost rank); `live` are the workers in the rounds. The run's config decides the collectives:
over every rank, or, with cluster.min_replicas, over the ranks still alive
(`World.all_reduce_live`), the rounds going on without a lost one while at least
min_replicas are left, and a spare (cluster.spares) taking a lost worker's place at the end
of the round that lost it. A place no spare took stays vacant until one stands by: a spare
started late, or the rank lost itself, back after it was left out (silent past timeout_s);
rank 0 invites them in its round's order (`offer`, INVITE), every rank hears it (`heard`)
and they join after that round, healed from a peer. Rank 0 logs each loss (`lost`), each
spare taken in (`replaced`) and each rank back (`back`); a role never asks which collective
to call or whether it records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stalebench.errors import RunError
from stalebench.runtime.quorum import RoundsFailed

if TYPE_CHECKING:
    import torch

    from stalebench.job import Job
    from stalebench.runtime.world import Op, World

LEFT_OUT = "dead, or silent past timeout_s: left out of the round"
# added to rank 0's order in a round's message: ranks standing by join after the round
INVITE = 4.0


class Members:
    """The workers in the rounds of a run of `n` workers (`quorum`: cluster.min_replicas,
    0 for rounds over every rank); `workers` and `live` as a checkpoint or a spare's
    welcome gave them, else the run's start."""

    def __init__(self, job: Job, world: World, workers: list[int] | None = None,
                 live: list[int] | None = None):  # fmt: skip
        self.world, self.n, self.quorum = world, job.num_workers, job.cfg.cluster.min_replicas
        if workers is None:  # the start: the N workers, then the spares (-1)
            workers = list(range(self.n)) + [-1] * (world.size - self.n)
        self.workers = workers
        self.live = live if live is not None else list(range(self.n))

    @property
    def me(self) -> int:
        """The worker this rank plays (-1: none yet)."""
        return self.workers[self.world.rank]

    def all_reduce(self, buf: torch.Tensor, seconds: float | None = None, wait: bool = True,
                   nbytes: int | None = None) -> Op[Any]:  # fmt: skip
        """`World.all_reduce` over every rank, or with min_replicas over those left
        (`all_reduce_live`: then its ranks summed, or a handle whose `members` they are)."""
        if self.quorum:
            return (yield from self.world.all_reduce_live(buf, seconds, wait, nbytes))
        return (yield from self.world.all_reduce(buf, seconds, wait, nbytes))

    def summed(self, ranks: list[int]) -> list[int]:
        """The workers of the ranks a live collective summed, in rank order."""
        return [self.workers[r] for r in ranks]

    def left(self, round_: int, live: list[int]) -> None:
        """After a round over the workers `live`: rank 0 logs each one gone since the last
        round as lost from `round_`; fewer left than min_replicas fails the run, naming
        them. `live` is the rounds' from here."""
        before, self.live = self.live, live
        lost_since(self.world, self.world.now(), round_, before, live)
        if len(live) < self.quorum:
            lost = ", ".join(map(str, sorted(set(range(self.n)) - set(live))))
            raise RunError(f"{len(live)} replicas left, fewer than cluster.min_replicas="
                           f"{self.quorum} (lost: {lost})")  # fmt: skip

    def failed(self, exc: Exception, round_: int, t: float) -> None:
        """The run fails because the replicas left could not go on together
        (`RoundsFailed`): rank 0 logs each one gone since the last round as lost, as
        `left` would have."""
        if isinstance(exc, RoundsFailed):
            lost_since(self.world, t, round_, self.live, self.summed(exc.left))

    def summing(self, buf: torch.Tensor, seconds: float | None = None,
                nbytes: int | None = None) -> Op[list[int]]:  # fmt: skip
        """A round's `all_reduce`, waited for: the workers it summed, in rank order (every
        worker, without min_replicas)."""
        got = yield from self.all_reduce(buf, seconds, nbytes=nbytes)
        return self.summed(got) if self.quorum else list(range(self.n))

    def of(self, handle: Any) -> list[int]:
        """The workers a completed `all_reduce(wait=False)` summed, in rank order."""
        return self.summed(handle.members) if self.quorum else list(range(self.n))

    @property
    def vacant(self) -> list[int]:
        """The ranks lost whose workers no rank plays now: places to fill."""
        return [r for r, w in enumerate(self.workers) if w >= 0 and w not in self.live]

    def offer(self, order: float) -> float:
        """Rank 0's `order` for the next round, with INVITE added when ranks stand by to
        fill the vacant places (`World.invite`) and the order is plain (0: no stop, no
        checkpoint, which a rank joining after the round would not take part in); another
        rank's, as it is."""
        if not self.quorum or self.world.record is None or order:
            return order
        vacant = self.vacant
        return order + INVITE if vacant and self.world.invite(vacant) else order

    def heard(self, order: float) -> float:
        """The round's `order` as every rank got it, without INVITE; with it, the ranks
        invited join after this round (`World.joining`)."""
        if order >= INVITE:
            self.world.invited()
            return order - INVITE
        return order

    def take_in_spares(self) -> list[int]:
        """The spares the last live collective chose (`World.joining`) take the lost
        workers' places (rank 0 logs each `replaced`); the lost ranks play no worker now.
        Returns the workers in the rounds from here, sorted, and makes them `live`."""
        world, workers = self.world, self.workers
        taken = [(spare, lost, workers[lost]) for spare, lost in world.joining]
        for spare, lost, worker in taken:
            workers[spare] = worker
            if world.record is None:
                continue
            if spare == lost:  # the rank lost, back in its own place
                world.record.events.emit("worker", world.now(), worker=worker, event="back")
            else:
                world.record.events.emit("worker", world.now(), worker=worker, event="replaced",
                                         by=f"spare {spare - self.n} (rank {spare})")  # fmt: skip
        for spare, lost, _ in taken:
            if spare != lost:
                workers[lost] = -1
        self.live = sorted([*self.live, *(worker for *_, worker in taken)])
        return self.live


def lost_since(world: World, t: float, round_: int, before: list[int], live: list[int]) -> None:
    """Rank 0 logs each worker in `before` and not in `live` as lost from `round_`, at run
    time `t`."""
    if world.record is None:
        return
    for w in sorted(set(before) - set(live)):
        world.record.events.emit("worker", t, worker=w, event="lost", round=round_,
                                 reason=LEFT_OUT)  # fmt: skip

"""A role's life, owned here once for every engine: a role supplies its step and its
exchange, the driver the rest.

An engine's `role(job, world)` builds what one rank plays (a replica, a server, a worker, a
pipeline stage), off the clock; `drive` then runs its life in either runtime:

    world.begin(role.warm_up)    every rank starts the clock together
    role.start() / load(part)    a fresh run's rank (the recording rank snapshots θ₀,
                                 `role.evaluated()`); a resumed run's, at its part of the
      / take_over(state)         checkpoint set; a spare (or a resumed run's rank that
                                 took no part) stands by until the survivors hand it a
                                 lost worker's place
    ending = role.run()          its rounds, steps or messages until the run stops
    ─ left out ─                 a replica the others went on without (silent past
                                 timeout_s: `LeftOut`) stands by as a spare of its own
                                 place, and is taken back in (`take_over`) at the round
                                 that invites it, healed from a peer
    ─ an error ─                 a lost worker (`WorkerDied`) leaves the run, its peers lose
                                 it at their next exchange; any other error fails the run:
                                 the recording rank's `role.fail(exc)` says what it had
                                 (the replicas left, the workers to stop), another rank's
                                 error ends that rank, its peers hearing of its loss
    record.finish(ending)        the recording rank's spares still standing by end; its end
                                 event, evaluations and summary.json; the other ranks' endings
                                 go unreported

A role never writes the summary, catches every error or releases the spares: its `run`
returns its `Ending` (which the driver reports on the recording rank), and the faults of
the worker it plays are the world's (`World.play`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from stalebench.runtime.faults import WorkerDied
from stalebench.runtime.quorum import LeftOut

if TYPE_CHECKING:
    import torch

    from stalebench.runtime.world import Op, World

log = logging.getLogger("stalebench")


@dataclasses.dataclass
class Ending:
    """How a role ended, on the recording rank: its model and θ (flat) to evaluate — or
    `params` None when no rank can put θ together (a pipeline's lost stage): the run ends
    unevaluated —, the updates made, when the run ended (run time), what ended it, the
    bytes its messages put on the wire, and measurements for summary.json alone."""

    model: torch.nn.Module | None
    params: torch.Tensor | None
    version: int
    t: float
    status: str = "completed"
    error: str | None = None
    bytes_sent: int = 0
    summary_extra: dict[str, Any] | None = None


class Role:
    """What one rank plays. `run` is its life after the start (`Op`: taken with `yield
    from`), returning its `Ending` (the driver reports the recording rank's; another rank
    may return None); `warm_up` a first step off the clock; `evaluated` θ₀ to snapshot;
    where it starts — `start` (a fresh run), `load` (a resumed run's part of the
    checkpoint), `take_over` (a spare chosen, with the state the survivors handed) —; `fail`
    what the recording rank makes of an error that ended `run`."""

    # a rank that stands by (`World.stand_by`) until it takes a lost worker's place
    stands_by = False

    def warm_up(self) -> Any:
        """A first step before the clock starts (imports, allocations): nothing by default."""
        return None

    def start(self) -> None:
        """A fresh run, once the clock has started: nothing by default."""

    def evaluated(self) -> torch.Tensor | None:
        """θ as the run evaluates it (flat), which the recording rank snapshots at a fresh
        run's start; None: the role snapshots its own."""
        return None

    def load(self, part: Any) -> None:
        """A resumed run: this rank's part of the checkpoint set (`World.checkpoint`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no checkpoint")

    def take_over(self, state: Any) -> bool:
        """A spare (or a resumed run's rank that took no part in its checkpoint) chosen to
        take a lost worker's place, with the `state` the survivors handed (`World.welcome`);
        False if the run ends instead."""
        raise NotImplementedError(f"{type(self).__name__} has no spares")

    def run(self) -> Op[Ending | None]:
        raise NotImplementedError

    def fail(self, exc: Exception) -> Op[Ending | None]:
        """The recording rank after `run` raised `exc`: record what the failure means and
        return the run's ending (status "failed"); by default the error ends the rank."""
        raise exc
        yield  # unreachable: makes `fail` a generator function


def drive(role: Role, world: World) -> Op[dict[str, Any] | None]:
    """One rank's life around `role` (see the module's docstring); the recording rank
    returns the run's summary, the others None."""
    yield from world.begin(role.warm_up)
    if not (yield from enter(role, world)):
        return None  # a spare the run did not need
    try:
        ending = yield from rounds(role, world)
    except WorkerDied:
        raise  # it is lost: its peers lose it at their next exchange
    except Exception as exc:
        if world.record is None:
            raise  # this rank ends; its peers hear of its loss
        ending = yield from role.fail(exc)
        if ending is not None:
            ending.status, ending.error = "failed", str(exc)
    if world.record is None or ending is None:
        return None
    world.release_spares()
    return finish(world, ending)


def enter(role: Role, world: World) -> Op[bool]:
    """Where `role` starts: a resumed run's rank at its part of the checkpoint; a spare, or
    a resumed run's rank that took no part, once it takes a lost worker's place (False: the
    run ended first); a fresh run's at the start."""
    if world.resumed is not None:
        role.load(world.resumed)
    elif role.stands_by or world.resumed_from >= 0:
        got = yield from world.stand_by()
        return got is not None and role.take_over(got[1])
    else:
        role.start()
        if world.record is not None and (theta := role.evaluated()) is not None:
            world.record.snapshots.maybe(0.0, 0, theta)
    return True


def rounds(role: Role, world: World) -> Op[Ending | None]:
    """`role.run()`; a rank left out of the rounds (`LeftOut`) stands by as a spare of its
    own place and runs again once taken back in — or ends with the run. The recording
    rank left out fails the run: no other rank records it."""
    while True:
        try:
            return (yield from role.run())
        except LeftOut as exc:
            if world.record is not None:
                raise
            log.warning("rank %d: %s; it stands by to be taken back in", world.rank, exc)
        got = yield from world.stand_by()
        if got is None or not role.take_over(got[1]):
            return None  # the run ended first


def finish(world: World, ending: Ending) -> dict[str, Any]:
    """The recording rank's end of the run: `ending` evaluated and written, with each rank's
    host and device."""
    record = world.record
    record.ranks = world.placed()
    if ending.params is None:  # nothing to evaluate: the end event and summary.json
        return record.fail(ending.t, ending.version, ending.error or ending.status)
    return record.finish(
        ending.model, ending.params, ending.version, ending.t, ending.status, ending.error,
        summary_extra=ending.summary_extra, bytes_sent=ending.bytes_sent,
    )  # fmt: skip


def attempt(op: Op[Any], what: str) -> Op[bool]:
    """`op` where the run ends anyway (telling a rank to stop, on the failure path): an
    error is logged as `what: error`, not raised; whether `op` went through."""
    try:
        yield from op
    except Exception as exc:
        log.warning("%s: %s", what, exc)
        return False
    return True

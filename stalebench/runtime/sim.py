"""The simulator as a runtime: every rank's program (`Engine.program`) in one process, each
rank on a virtual clock of its own, driven by this module's scheduler.

A rank runs until it waits: for a message not yet sent, or for the others at a collective.
Its world then yields the scheduler a request (`Request`: `Begin`, `Sleep`, `Recv`,
`Listen`, `StandBy`, `Welcome`, `Await`), which says what the rank waits for and handles
itself (`Request.handle`); anything else a program yields is an error.
Compute and a fault's pause only move its clock (its step's gradient is computed for real,
on a model the ranks share); a send stamps the message with the sender's clock plus the
push delay, and a receive takes it at the later of the two clocks plus the pull delay; a
collective ends for every rank at the latest of their clocks plus each one's cost. A hub's
NIC is shared by its peers: a message reaching it is delivered once its downlink is free of
the messages before it, and a message it sends leaves once its uplink is free of the ones
before (the hub goes on meanwhile; `runtime.network`). Ranks
that can run are taken in the order of the times they go on at, ties in the order they
became ready, so a config and a seed give one history (`events.jsonl` byte for byte).

A listening rank (a server) takes its peers' messages in the order they arrive (ties in the
order they were sent): it takes the first only once no rank that runs before it could still
send an earlier one, i.e. when it is itself the next to go on. A lost peer's loss reaches
it as a message would, at the time it was lost.

A rank that is lost (a `die` fault, an error) stops; when every rank left waits for
something that will never come, each gets that loss as the error a real rank gets once its
timeout passes, in rank order. Whatever ends the run, summary.json is written: by rank 0's
program, or here when rank 0's program itself failed. A simulated run keeps checkpoints only
when `checkpoint_every_s` asks for them (virtual seconds; it reruns from the start in
seconds, deterministically); a resumed one starts every rank at the checkpoint's time.

What the real runtime does around a process is done here once for the whole run: the
thread count, events flushed every 0.2 s of real time (a write per event would cost more
than the simulator's own bookkeeping), the cyclic collector kept off the objects the
set-up built, and the simulator's own real time reported in summary.json (`sim_loop_s`).
"""

from __future__ import annotations

import gc
import heapq
import io
import itertools
import math
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from stalebench import placement
from stalebench.errors import RunError
from stalebench.job import Job
from stalebench.metrics.summary import stop
from stalebench.runtime import checkpoint
from stalebench.runtime.batching import Batcher, Deferred
from stalebench.runtime.compute import Host
from stalebench.runtime.faults import WorkerLost
from stalebench.runtime.network import Calendars, Link, Network, Topology
from stalebench.runtime.quorum import LeftOut
from stalebench.runtime.record import RunRecord
from stalebench.runtime.world import Listener, Op, Pause, T, World, nbytes

Program = Callable[[Job, World], Op[Any]]


def _no_pause(at: float, seconds: float) -> None:
    pass


class EventQueue:
    """Items by virtual time, ties in the order they were pushed (so a config and a seed
    give one history)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, t: float, item: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._order), item))

    def pop(self) -> tuple[float, Any]:
        """The earliest item: (virtual time, item)."""
        t, _, item = heapq.heappop(self._heap)
        return t, item

    def first(self) -> float:
        """The earliest item's time (inf when none is left)."""
        return self._heap[0][0] if self._heap else math.inf


class Request:
    """What a rank's program yields the scheduler when it waits (its world's operations
    yield it, a program only passes it on): `handle` does what the scheduler does with it;
    what the rank then waits for is kept in `Simulator.waiting` until it comes, `name`
    saying which in the error of a rank that waits forever."""

    __slots__ = ()
    name = ""

    def handle(self, sim: Simulator, rank: int) -> None:
        raise NotImplementedError


class Begin(Request):
    """Set up: every rank starts together once all are (`Simulator._begin`)."""

    __slots__ = ()
    name = "begin"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.waiting[rank] = self
        sim._begin(rank)


class Sleep(Request):
    """Its step's time: it goes on at its clock (the ranks before it taking their turn)."""

    __slots__ = ()
    name = "sleep"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.ready.push(sim.worlds[rank].clock, (rank, None, None))


@dataclass(slots=True)
class Recv(Request):
    """The next message from rank `src`, not yet sent since run time `since`: it goes on
    once it is (`Simulator.post`), or learns of `src`'s loss (with cluster.min_replicas: or
    of its silence past timeout_s)."""

    src: int
    since: float
    name = "recv"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.waiting[rank] = self
        if sim.told:  # cluster.min_replicas: it gives up on `src` past timeout_s
            sim.timers.push(self.since + sim.timeout_s, (rank, self))


@dataclass(slots=True)
class Listen(Request):
    """A listener's next message, the earliest it has in at `at` (inf: none yet): it goes
    on at its latest wake (`wake`, `Simulator._listen`), the earlier ones void."""

    at: float
    wake: int | None = None
    name = "listen"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.waiting[rank] = self
        sim._listen(rank, self.at)


class StandBy(Request):
    """A spare off the rounds: they go on without it (`World.stand_by`)."""

    __slots__ = ()
    name = "standby"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.waiting[rank] = self
        sim.standby.append(rank)
        sim._recheck_live()


@dataclass(slots=True)
class Welcome(Request):
    """A survivor at `welcome`, with the `state` the chosen spares get
    (`Simulator._welcome`)."""

    state: Any
    name = "welcome"

    def handle(self, sim: Simulator, rank: int) -> None:
        sim.waiting[rank], sim.welcomed[rank] = self, self.state
        sim._welcome()


class Await(Request):
    """A collective the rank waits for: `Simulator.collective` or `await_` made it wait
    before it yielded this, and the collective's end resumes it."""

    __slots__ = ()
    name = "collective"

    def handle(self, sim: Simulator, rank: int) -> None:
        pass


class SimWorld(World):
    """One rank's world on its virtual clock (`clock`, seconds)."""

    def __init__(self, sim: Simulator, rank: int, record: RunRecord | None):
        self.sim, self.rank, self.size = sim, rank, sim.size
        self.profile, self.record = sim.job.profile, record
        self.device = sim.device  # one process: every rank computes where the model is
        self.network = Network(self.profile.cfg, sim.topology)
        self.overhead_s = self.profile.cfg.overhead_ms / 1000
        self.stall_s = self.profile.cfg.stall_ms / 1000
        self.hub_s = self.profile.cfg.hub_ms / 1000
        self.up, self.down = Link(), Link()  # a hub's NIC both ways; a peer's downlink
        self.wire_s = 0.0
        self.clock = 0.0
        self.linked = 0.0  # when this rank's collectives under way end: the next starts then
        self.pending: list[Deferred] = []  # lazy steps not yet run, oldest first

    def now(self) -> float:
        return self.clock

    @property
    def events(self):
        return self.sim.record.events

    def shared(self, key: str, build: Callable[[], T]) -> T:
        if key not in self.sim.shared:
            self.sim.shared[key] = build()
        return self.sim.shared[key]

    def mailbox(self, src: int, dst: int, size: int, header: int) -> torch.Tensor:
        # one buffer for both ends, as a same-host mailbox is in real processes: a message
        # is read where its sender wrote it; in a cost-only run its header alone, the
        # payload having no values, while the wire is charged for all `size` slots
        return self.shared(f"mailbox {src}>{dst} {size}", lambda: self.sim.buffer(size, header))

    def message(self, size: int, header: int) -> torch.Tensor:
        return self.sim.buffer(size, header)

    @property
    def run_dir(self) -> Path:
        return self.sim.record.run_dir

    def begin(self, warm_up: Callable[[], Any]) -> Op[None]:
        yield Begin()  # no warm-up on a virtual clock; every rank starts together

    def strike(self, on_pause: Pause | None = None) -> float:
        assert self.faults is not None, "world.play(worker) before its first step"
        start = self.faults.strike(self.clock, on_pause or _no_pause)
        paused, self.clock = start - self.clock, start
        return paused

    def compute(self, step: Callable[[], T], step_s: float, lazy: bool = False):
        # the host's share: the rank's loop around its step, the cores it shares, and
        # what it waits on no core
        step_s = self.sim.host.run(self.rank, self.clock, step_s + self.overhead_s)
        step_s += self.stall_s
        self.clock += step_s
        if lazy:
            self._defer(step)
            return None, step_s
        self.settle()
        if not self.sim.batcher.can_batch(step):
            return step(), step_s
        # its result is needed now: the rank waits out its step (as a real step takes its
        # time), so that the ranks whose steps begin meanwhile take theirs, and it runs in
        # a batch with them when it wakes
        deferred = self._defer(step)
        yield Sleep()
        deferred.run()
        self.pending.clear()
        return deferred.result, step_s

    def _defer(self, step: Callable[[], Any]) -> Deferred:
        deferred = Deferred(step, self)
        self.pending.append(deferred)
        self.sim.batcher.add(deferred)
        return deferred

    def settle(self) -> None:
        """Run this rank's lazy steps not yet run, before it computes anew or joins a
        collective (a lazy step reads only what the rank's own steps change)."""
        for deferred in self.pending:
            deferred.run()
        self.pending.clear()

    def isend(self, buf: torch.Tensor, dst: int) -> Op[None]:
        # to a rank of its host: over the host's link (`Network.between`)
        size, network = self.sim.nbytes(buf), self.network.between(self.rank, dst)
        if self.hub:  # it leaves once the hub's uplink is free (the hub goes on meanwhile);
            # its receiver pays the pull time from there, and the topology's links before
            wire = network.pull_wire_s(size)
            at = network.leave(self.up, self.clock, wire)
            at += network.cross(self.rank, dst, size, at + wire, wire)
        else:  # held until it is out of its NIC, then across the topology's links; a
            # pipelined message spends its latency on the way, its sender going on
            self._pay(network.hold_s(size, self._slow_s()))
            self._pay(network.cross(self.rank, dst, size, self.clock, network.push_wire_s(size)))
            at = self.clock + network.flight_s()
        if self.pending:  # the lazy steps that write this message, and any still unrun
            self.pending = [d for d in self.pending if d.step is not None]
        self.sim.post(self.rank, dst, at, buf, tuple(self.pending))
        return
        yield

    def wait(self, work: Any, dst: int) -> Op[None]:
        return  # a message is in its receiver's mailbox once sent
        yield

    send = isend  # isend, then a wait that returns at once

    def recv(self, buf: torch.Tensor, src: int, patient: bool = False) -> Op[float]:
        box = self.sim.mail[(src, self.rank)]
        if not box and src in self.sim.lost and self.sim.told:  # its messages are read first
            self.clock = max(self.clock, self.sim.worlds[src].clock)
            raise self.sim.loss_of(src)
        if (src, self.rank) in self.sim.cut:
            raise WorkerLost(src, f"rank {src} was silent past timeout_s")  # given up before
        if not box:
            yield Recv(src, self.clock)
        elif self.sim.told and box[0][0] > self.clock + self.sim.timeout_s:
            self.sim.cut.add((src, self.rank))  # it comes past this rank's timeout
            self.clock += self.sim.timeout_s
            raise WorkerLost(src, f"rank {src} was silent past timeout_s")
        arrival, message, deferred = box.popleft()
        for step in deferred:
            step.run()
        if message is not buf:
            buf.copy_(message)
        # a hub's message is paid here, the pull time once it has left the hub's uplink; a
        # peer's was paid by its sender (its push time is the transfer: the bytes reach this
        # rank as they leave) and is through once this rank's downlink is free of the ones
        # before it, as a hub's downlink takes its workers' messages
        pull, size = not self.hub and src in self.hubs, self.sim.nbytes(buf)
        network = self.network.between(src, self.rank)
        if self.hub:
            arrival = network.take(self.down, arrival, network.push_wire_s(size))
        elif not pull:
            arrival = network.peer_through(self.down, arrival, size)
        waited = self.resume(arrival)
        if self.hub:
            self.clock += self.handle()
        elif pull:
            self._pay(network.pull_s(size))
        return waited

    def resume(self, at: float) -> float:
        """Go on at `at`, once what this rank waited for is in; the seconds waited. A rank
        that blocked (`at` is later than its clock) then waits for a core too, while the
        run's ranks outnumber the host's (`cluster.wake_ms`)."""
        if at <= self.clock:
            return 0.0
        waited = at - self.clock + self.sim.host.wake(self.rank, at)
        self.clock += waited
        return waited

    def handle(self) -> float:
        """What a hub's handling of the message it took costs (`cluster.hub_ms`, on the
        cores it shares)."""
        return self.sim.host.run(self.rank, self.clock, self.hub_s) if self.hub_s else 0.0

    def _pay(self, seconds: float) -> None:
        self.clock += seconds
        self.wire_s += seconds

    def listen(self, peers: dict[int, int], make: Callable[[int], list[torch.Tensor]]):
        listener = SimListener(self, peers)
        self.sim.listeners[self.rank] = listener
        return listener

    def all_reduce(self, buf: torch.Tensor, seconds=None, wait: bool = True, nbytes=None):
        seconds = self._priced(seconds, nbytes, self.network.allreduce_s, buf)
        return (yield from self._collective(Collective.SUM, buf, None, seconds, wait))

    def all_reduce_live(self, buf: torch.Tensor, seconds=None, wait=True, nbytes=None):
        seconds = self._priced(seconds, nbytes, self.network.allreduce_s, buf)
        return (yield from self._collective(Collective.SUM, buf, None, seconds, wait, live=True))

    def collectives_end(self) -> float:
        return self.linked

    @property
    def joining(self) -> list[tuple[int, int]]:  # type: ignore[override]
        return self.sim.joining

    def welcome(self, state: Any) -> Op[None]:
        self.settle()
        yield Welcome(state)

    def stand_by(self) -> Op[tuple[int, Any] | None]:
        return (yield StandBy())

    def invite(self, vacant: list[int]) -> bool:
        return self.sim.told and self.sim.invite(vacant)

    def invited(self) -> None:
        self.sim.invited()

    def placed(self) -> list[dict[str, Any]]:
        return [placement.placed(r, self.device) for r in range(self.size)]

    def release_spares(self) -> None:
        sim = self.sim  # those chosen as the run stopped are never welcomed: they end too
        for spare in [*sim.standby, *(s for s, _ in sim.joining)]:
            del sim.waiting[spare]  # each returns None from `stand_by`
            sim.ready.push(self.clock, (spare, None, None))
        sim.standby, sim.joining = [], []

    def all_gather(self, out, buf: torch.Tensor, seconds=None, wait=True, nbytes=None):
        seconds = self._priced(seconds, nbytes, self.network.allgather_s, buf)
        return (yield from self._collective(Collective.GATHER, buf, out, seconds, wait))

    def _collective(
        self, kind: str, buf, out, seconds: float, wait: bool, live: bool = False
    ) -> Op[Any]:  # fmt: skip
        """Start a collective; with `wait`, the seconds waited for it (`live`: the ranks it
        summed), else its handle."""
        self.settle()
        self.left_out()
        self.wire_s += seconds
        start = max(self.clock, self.linked)
        self.linked = start + seconds
        handle = self.sim.collective(self.rank, kind, buf, out, start, self.linked, wait, live)
        if not wait:
            return handle
        yield Await()  # resumed at its end, with the ranks that waited for it
        waited = self._ended(handle)
        return handle.members if live else waited

    def pieces(self, buf, bounds, order, ready, forward=None, spans=None, sizes=None):
        return SimPieces(self, buf, bounds, order, ready, forward, spans, sizes)

    def complete(self, handle: Collective) -> Op[float]:
        if handle.done is None:
            self.sim.await_(self.rank, handle)
            yield Await()
        return self._ended(handle)

    def _ended(self, handle: Collective) -> float:
        self.left_out()
        return self.resume(handle.done)

    def left_out(self) -> None:
        """`LeftOut` when the live collectives went on without this rank (it came past
        their timeout, `Simulator._maybe_finish`): it stands by for its own place."""
        if self.rank in self.sim.out:
            self.sim.out.discard(self.rank)
            self.sim.back.add(self.rank)
            raise LeftOut(
                f"rank {self.rank} was left out of the replicas that went on (it came "
                f"past timeout_s={self.sim.timeout_s:g}, twice: the collective's and the "
                "regroup's)"
            )


def piece_ends(
    network, bounds, order, ready, step_s: float, slow_s: float = 0.0, spans=None, sizes=None
) -> list[float]:
    """When each piece of a buffer (`bounds`), made at `ready` (fractions of a step of
    `step_s` seconds) and all-reduced in `order` (`Network.piece_ends`: one after another,
    each once made and the one before it is through), is summed (seconds from the step's
    start); `spans`: the tensors each piece holds (`Layout.spans`), `sizes` the bytes each
    carries (default: all of its range)."""
    sizes = sizes if sizes is not None else [4 * (hi - lo) for lo, hi in bounds]
    return network.piece_ends(sizes, order, [r * step_s for r in ready], slow_s, spans)


def pieces_s(network, bounds, order, ready, step_s: float, slow_s=0.0, spans=None, sizes=None):
    """How long the pieces take past the step (`piece_ends`): the round's communication
    when the update waits for all of them (DDP's buckets)."""
    return max(piece_ends(network, bounds, order, ready, step_s, slow_s, spans, sizes)) - step_s


def p3_stall_s(
    network, bounds, order, ready, forward, step_s: float, slow_s=0.0, spans=None, sizes=None
) -> float:
    """P3: how long the next forward pass waits for the pieces (`piece_ends`), which it
    applies module by module as it reaches them. It begins once the piece holding the
    round's statistics (made last, sent first) is in, then each module's forward, its
    share of a step of `step_s` (`forward`: (share, the pieces holding its tensors) in
    forward order), once its pieces are; returns the seconds it waited in all."""
    ends = piece_ends(network, bounds, order, ready, step_s, slow_s, spans, sizes)
    t, waited = step_s, 0.0
    for share, holding in [(0.0, [0]), *forward]:
        need = max(ends[k] for k in holding)
        if need > t:
            waited, t = waited + need - t, need
        t += share * step_s
    return waited


class SimPieces:
    """`World.pieces` on the virtual clock: the round's pieces, made at `ready` (fractions of
    a step) and all-reduced one after another in `order`, each once the one before it is
    through and backward has made it, end at e(c) for a step of c seconds; the round is one
    all-reduce of the whole buffer lasting e(c) − c past the step. e grows with c, so the
    round ends at max over the ranks of e(c), as in real processes."""

    hooked = False  # a step takes no time: nothing is posted
    waited = 0.0

    def __init__(self, world: SimWorld, buf, bounds, order, ready, forward=None, spans=None,
                 sizes=None):  # fmt: skip
        self.world, self.bounds, self.spans = world, list(bounds), spans  # `buf`: whole
        self.sizes = sizes
        self.order, self.ready, self.forward = list(order), list(ready), forward
        self.memo: dict[tuple[float, float], float] = {}

    def post(self, piece: int, round_: int) -> None:
        pass

    def wait(self, piece: int) -> None:
        raise RunError("a round's pieces waited for one at a time run in real processes only")

    def comm_s(self, step_s: float, slow_s: float = 0.0) -> float:
        """e(c) − c: how long the round's communication lasts past a step of `step_s`;
        under P3 (`forward` given) how long the next forward pass waits for it, a step of
        the same length (the round's update is applied whole at its end: for the
        element-wise rules P3 takes, the θ its forward reaches layer by layer)."""
        key = (step_s, slow_s)  # the same for every round of a constant step: once
        if key not in self.memo:
            net, args = self.world.network, (self.bounds, self.order, self.ready)
            keys = (self.spans, self.sizes)  # the tensors each piece holds, its bytes
            if self.forward is not None:
                stall = p3_stall_s(net, *args, self.forward, step_s, slow_s, *keys)
                self.memo[key] = stall
            else:
                self.memo[key] = pieces_s(net, *args, step_s, slow_s, *keys)
        return self.memo[key]

    def close(self) -> None:
        pass


class Collective:
    """The k-th collective of every rank: what each brought, and when it ends (once all
    have come: the latest of their starts plus each one's cost)."""

    SUM, GATHER = "all_reduce", "all_gather"

    def __init__(self, index: int, kind: str, live: bool = False):
        self.index, self.kind, self.live = index, kind, live  # the k-th; `live`: over the
        # ranks not lost (`all_reduce_live`)
        self.came: list[tuple[int, torch.Tensor, Any, float]] = []  # rank, buf, out, end
        self.starts: dict[int, float] = {}  # when each rank came
        self.waiters: list[int] = []
        self.done: float | None = None
        self.members: list[int] = []  # the ranks it summed

    def first(self) -> float:
        """When the first rank came (run time)."""
        return min(self.starts.values())

    def finish(self, lost_at: float = -math.inf) -> float:
        """Every rank's result in place (a sum in rank order, or every rank's piece); a live
        one ends no sooner than its lost ranks were lost (`lost_at`: when the last was)."""
        came = sorted(self.came, key=lambda c: c[0])
        self.members = [c[0] for c in came]
        if self.kind == Collective.SUM:
            bufs = [buf for _, buf, _, _ in came]
            if not _sum_small(bufs):
                total = bufs[0].clone()
                for buf in bufs[1:]:
                    total += buf
                for buf in bufs:
                    buf.copy_(total)
        else:
            for _, _, out, _ in came:
                for piece, (_, buf, _, _) in zip(out, came, strict=True):
                    piece.copy_(buf)
        self.done = max(lost_at, *(end for *_, end in came))
        return self.done


SMALL = 4096  # elements: a buffer summed through numpy (a message's head, the statistics)


def _sum_small(bufs: list[torch.Tensor]) -> bool:
    """Sum small CPU buffers of one dtype and shape in order, into each of them, as
    `Collective.finish` does with tensor operations (elementwise, in the same order: the
    same bits) without a tensor operation's overhead; False (nothing done) for others."""
    first = bufs[0]
    if first.numel() > SMALL or first.device.type != "cpu" or first.requires_grad:
        return False
    dtype, shape = first.dtype, first.shape
    if dtype not in _NUMPY or any(
        b.dtype != dtype or b.shape != shape or b.device.type != "cpu" or b.requires_grad
        for b in bufs
    ):
        return False
    arrays = [b.numpy() for b in bufs]
    total = arrays[0].copy()
    for a in arrays[1:]:
        total += a
    for a in arrays:
        a[...] = total
    return True


_NUMPY = (torch.float32, torch.float64)


class SimListener(Listener):
    """A rank's ear on the virtual clock: its peers' messages (and losses) by arrival, ties
    in the order they were sent; each message is the sender's buffer, read in place."""

    def __init__(self, world: SimWorld, peers: dict[int, int]):
        self.world, self.sim = world, world.sim
        self.peer_of = {rank: peer for peer, rank in peers.items()}
        # (arrival, order, rank, message, the lazy steps that write it)
        self.heap: list[tuple[float, int, int, Any, tuple]] = []
        self.due = math.inf  # when the scheduler resumes it, while it waits

    def take(self, arrival: float, src: int, message: Any, deferred: tuple) -> None:
        heapq.heappush(self.heap, (arrival, next(self.sim.order), src, message, deferred))

    def next(
        self, active: set[int], until: float = 0.0, read: bool = True
    ) -> Op[tuple[int, list] | None]:
        world, heap, woken = self.world, self.heap, -math.inf
        while True:
            while heap and self.peer_of.get(heap[0][2]) not in active:
                heapq.heappop(heap)  # from a peer told to stop, or replaced: not awaited
            if not heap:
                woken = yield Listen(math.inf)
                continue
            arrival, _, src, message, deferred = heap[0]
            at = max(world.clock, arrival)
            if not (at <= woken or at < self.sim.ready.first()):
                # a rank that goes on before `at` may still send an earlier message: resumed
                # at `at` (the time it is woken for), every rank left goes on no sooner
                woken = yield Listen(at)
                continue
            if until and arrival > until:
                world.clock = max(world.clock, until)
                return None
            heapq.heappop(heap)
            if world.hub and not isinstance(message, BaseException):  # its downlink's queue
                network = world.network.between(src, world.rank)
                wire = network.push_wire_s(world.sim.nbytes(message))
                at = max(at, network.take(world.down, arrival, wire))
            world.resume(at)
            peer = self.peer_of[src]
            if world.hub and not isinstance(message, BaseException):
                world.clock += world.handle()
            for step in deferred if read else ():
                step.run()
            if isinstance(message, BaseException):
                if isinstance(message, WorkerLost) and message.worker == peer:
                    raise message
                raise WorkerLost(peer, str(message))
            return peer, [message]

    def replace(self, peer: int, rank: int) -> None:
        self.peer_of = {r: p for r, p in self.peer_of.items() if p != peer}
        self.peer_of[rank] = peer


class Simulator:
    """The scheduler: the ranks' programs, their mailboxes, who waits for what."""

    def __init__(self, job: Job, run_dir: Path, size: int):
        self.job, self.size = job, size
        resume = checkpoint.load(run_dir, job.meta["config_sha"]) if job.cfg.resume else None
        self.record = RunRecord(job, run_dir, flush_s=0.2, resume=resume, keep_events=True)
        self.record.virtual_time = True
        self.device = job.device(0)  # this process's, where the ranks' shared model is
        self.topology = Topology(job.profile.cfg, size)  # its links' bookings: the run's own
        self.topology.calendars = Calendars.local(self.topology.links, size)
        cluster = job.profile.cfg
        # the shared cores
        self.host = Host(cluster.host_cores, size, cluster.wake_ms / 1000, cluster.wake_form)
        self.worlds = [SimWorld(self, r, self.record if r == 0 else None) for r in range(size)]
        for world in self.worlds:
            world.every_s = checkpoint.every_s(job.cfg)
        self.shared: dict[str, Any] = {}
        self.mail: defaultdict[tuple[int, int], deque] = defaultdict(deque)
        self.listeners: dict[int, SimListener] = {}
        self.order = itertools.count()  # of the messages sent
        # (rank, what to throw into it or None, the listener wake it is or None), by the
        # time the rank goes on at
        self.ready = EventQueue()
        self.wakes = itertools.count()  # a listener's latest wake; the earlier are void
        self.waiting: dict[int, Request] = {}  # rank → what it waits for
        self.collectives: dict[int, Collective] = {}  # by index, until every rank came
        self.issued = [0] * size  # collectives each rank has started
        self.lost: dict[int, BaseException] = {}
        self.results: dict[int, Any] = {}
        self.batcher = Batcher(job.cfg.sim.batch_max)
        self.begun = 0  # ranks set up and waiting for the others to start
        # spares: standing by, chosen to take a lost rank's place ((spare, lost rank), until
        # the survivors' `welcome`), the survivors' welcomes so far, what a resumed rank gets
        self.standby: list[int] = []
        self.joining: list[tuple[int, int]] = []
        self.replaced: set[int] = set()  # lost ranks already handed to the choice of spares
        self.welcomed: dict[int, Any] = {}
        self.handoff: dict[int, Any] = {}
        # cluster.min_replicas: a rank waiting for a lost rank's message learns of the loss
        # at once (as a real one whose peer's connection closes), to go on without it;
        # otherwise once every rank left waits (`_time_out`)
        self.told = bool(job.cfg.cluster.min_replicas)
        # and a rank silent past timeout_s (virtual seconds) is left out (`out`: until it
        # learns so, `SimWorld.left_out`), or lost to the rank waiting for its message
        # (`cut`: (src, dst) pairs, until src is welcomed back); a rank back stands by
        # for its own place (`back`); rank 0's invitation of ranks standing by (`invite`)
        self.timeout_s = job.cfg.timeout_s
        self.out: set[int] = set()
        self.cut: set[tuple[int, int]] = set()
        self.back: set[int] = set()
        self.invitation: list[tuple[int, int]] = []
        self.timers = EventQueue()  # (rank, the receive or live collective) by its timeout
        # a cost-only run's message buffers: each one's bytes on the wire (its header alone
        # is held), by the buffer's id, while the buffer lives (its id its own till then)
        self.wire: dict[int, int] = {}

    def buffer(self, size: int, header: int) -> torch.Tensor:
        """A message buffer of `size` float32 slots: whole, or in a cost-only run its
        `header` slots, the wire charged for `size` (`nbytes`)."""
        if self.job.numerics:
            return torch.zeros(size)
        buf = torch.zeros(header)
        self.wire[id(buf)] = 4 * size
        weakref.finalize(buf, self.wire.pop, id(buf), None)
        return buf

    def nbytes(self, buf: torch.Tensor) -> int:
        """A message's bytes on the wire: a cost-only buffer's whole size, else its own."""
        if self.wire:
            return self.wire.get(id(buf)) or nbytes(buf)
        return nbytes(buf)

    def post(self, src: int, dst: int, arrival: float, buf: Any, deferred: tuple = ()) -> None:
        if self.cut and (src, dst) in self.cut:
            return  # its receiver gave up on it: never taken
        what = self.waiting.get(dst)
        awaits = type(what) is Recv and what.src == src  # `_awaits(dst, src)`
        if self.told and awaits and arrival > what.since + self.timeout_s:
            self._give_up(dst, src)  # it came past the receiver's timeout
            return
        listener = self.listeners.get(dst)
        if listener is not None and src in listener.peer_of:
            listener.take(arrival, src, buf, deferred)
            if type(what) is Listen:
                self._listen(dst, max(self.worlds[dst].clock, arrival))
            return
        self.mail[(src, dst)].append((arrival, buf, deferred))
        if awaits:
            del self.waiting[dst]
            self.ready.push(max(self.worlds[dst].clock, arrival), (dst, None, None))

    def _listen(self, rank: int, at: float) -> None:
        """The listening rank goes on at `at`, if that is sooner than it would."""
        listener = self.listeners[rank]
        if at < listener.due:
            wake = next(self.wakes)
            listener.due, self.waiting[rank] = at, Listen(at, wake)
            self.ready.push(at, (rank, None, wake))

    def run(self, program: Program) -> dict[str, Any]:
        torch.set_num_threads(self.job.cfg.num_threads)
        self.started = time.perf_counter()  # again once every rank is set up (`begin`)
        self.record.timing = lambda: {
            # the loop's own time: torch.func's one-time start-up is reported apart
            "sim_loop_s": time.perf_counter() - self.started - self.batcher.start_s,
            **self.batcher.report(),
        }
        programs = [program(self.job, world) for world in self.worlds]
        for rank in range(self.size):
            self.ready.push(0.0, (rank, None, None))
        gc.freeze()  # the set-up's objects live all run: keep the collector off them
        try:
            while self.ready or self.waiting:
                while self.ready or self.timers:
                    if self.timers.first() < self.ready.first():  # a timeout passes first
                        self._expire(*self.timers.pop()[1])
                        continue
                    at, (rank, error, wake) = self.ready.pop()
                    if wake is None:
                        self._resume(programs[rank], rank, error, self.handoff.pop(rank, None))
                    elif self._woken(rank, wake):  # else void
                        del self.waiting[rank]
                        self.listeners[rank].due = math.inf
                        self._resume(programs[rank], rank, None, at)
                self._time_out()
        finally:
            gc.unfreeze()
        if 0 in self.results:
            return self.results[0]
        error = self.lost.get(0, RunError("rank 0 ended without a summary"))
        cfg = self.job.cfg
        return stop(self.record.run_dir, self.job.meta, "failed", str(error),
                    cfg.budget.target_accuracy)  # fmt: skip

    def _resume(
        self, program: Op[Any], rank: int, error: BaseException | None, value: Any = None
    ) -> None:
        try:
            request = program.send(value) if error is None else program.throw(error)
        except StopIteration as done:
            self.results[rank] = done.value
            return
        except Exception as exc:  # the rank is lost (an interrupt is no Exception: it ends all)
            self.lost[rank] = exc
            for dst, listener in self.listeners.items():  # its listeners hear of it then
                if rank in listener.peer_of:
                    self.post(rank, dst, self.worlds[rank].clock, exc)
            for dst in sorted(self.waiting):  # so do the ranks waiting for its message
                if self._awaits(dst, rank) and self.told:
                    del self.waiting[dst]
                    at = max(self.worlds[dst].clock, self.worlds[rank].clock)
                    self.ready.push(at, (dst, self.loss_of(rank), None))
            self._recheck_live()  # a live collective goes on without it
            return
        if not isinstance(request, Request):
            raise RunError(f"rank {rank} yielded {request!r}, not a simulator request")
        request.handle(self, rank)

    def _awaits(self, rank: int, src: int) -> bool:
        """Whether `rank` waits for the next message from `src` (a `recv`)."""
        what = self.waiting.get(rank)
        return isinstance(what, Recv) and what.src == src

    def _give_up(self, rank: int, src: int) -> None:
        """`rank`, waiting for a message from `src` since `since`, times out: it goes on at
        since + timeout_s with `src` lost, and never takes its messages (`cut`)."""
        since = self.waiting.pop(rank).since
        self.cut.add((src, rank))
        self.worlds[rank].clock = max(self.worlds[rank].clock, since + self.timeout_s)
        error = WorkerLost(src, f"rank {src} was silent past timeout_s={self.timeout_s:g}")
        self.ready.push(self.worlds[rank].clock, (rank, error, None))

    def _expire(self, rank: int, what: Request | Collective) -> None:
        """A timeout passes (`timers`): `rank`'s receive, if it still waits for it; a live
        collective, if it has not ended."""
        if self.waiting.get(rank) is what:
            self._give_up(rank, what.src)
        elif isinstance(what, Collective) and self.collectives.get(what.index) is what:
            self._maybe_finish(what.index, what, timed_out=True)

    def invite(self, vacant: list[int]) -> bool:
        """Rank 0's invitation (`World.invite`): a rank back standing by takes its own
        vacant place, a spare of the cluster the others', in order (a resumed run's worker
        rank that took no part in its checkpoint stays out, as in the run uninterrupted)."""
        if self.joining or self.invitation:
            return False
        spares = [s for s in self.standby if s not in self.back and s >= self.job.num_workers]
        for rank in vacant:
            if rank in self.back and rank in self.standby:
                self.invitation.append((rank, rank))
            elif spares:
                self.invitation.append((spares.pop(0), rank))
        return bool(self.invitation)

    def invited(self) -> None:
        """The first rank told moves the invited from standing by to joining."""
        for spare, lost in self.invitation:
            self.standby.remove(spare)
            self.joining.append((spare, lost))
        self.invitation = []

    def _woken(self, rank: int, wake: int) -> bool:
        """Whether `wake` is the listening `rank`'s latest (`_listen`): the earlier are void."""
        what = self.waiting.get(rank)
        return isinstance(what, Listen) and what.wake == wake

    def loss_of(self, rank: int) -> WorkerLost:
        """What a rank waiting for a message from the lost `rank` gets."""
        return WorkerLost(rank, f"rank {rank} lost: {self.lost[rank]}")

    def _begin(self, rank: int) -> None:
        """Every rank set up: the run starts, in rank order (the simulator's own time, for
        summary.json, from here: what it costs to simulate, not to build the ranks)."""
        self.begun += 1  # its `Begin` waits
        if self.begun < self.size:
            return
        at, version, due, ranks = self.worlds[0]._start_of()
        hubs = frozenset(r for r, world in enumerate(self.worlds) if world.hub)
        for r in range(self.size):
            self.worlds[r].hubs = hubs
            del self.waiting[r]
            self.worlds[r].clock = at
            self.worlds[r]._resume_from(version, due, ranks)
            self.ready.push(at, (r, None, None))
        gc.freeze()  # what the ranks built lives all run: keep the collector off it
        self.started = time.perf_counter()

    def collective(
        self, rank: int, kind: str, buf, out, start: float, end: float, wait: bool,
        live: bool = False,
    ) -> Collective:  # fmt: skip
        """`rank` starts its next collective, ending at `end` on its own (`wait`: and waits
        for it); once every rank has started it (`live`: every rank not lost), the ranks
        waiting for it go on at its end, in rank order."""
        k, self.issued[rank] = self.issued[rank], self.issued[rank] + 1
        c = self.collectives.get(k)
        if c is None:
            c = self.collectives[k] = Collective(k, kind, live)
            if live and self.told:  # its timeout: the ranks not come by then are left out
                self.timers.push(start + 2 * self.timeout_s, (rank, c))
        if c.kind != kind or c.live != live:
            raise RunError(f"rank {rank}'s collective {k} is an {kind}, another rank's an {c.kind}")
        c.came.append((rank, buf, out, end))
        c.starts[rank] = start
        if wait:
            self.await_(rank, c)
        self._maybe_finish(k, c)
        return c

    def _recheck_live(self) -> None:
        """A rank lost or standing by: the live collectives that waited for it may end."""
        for k, c in list(self.collectives.items()):
            if c.live:
                self._maybe_finish(k, c)

    def _maybe_finish(self, k: int, c: Collective, timed_out: bool = False) -> None:
        """A collective every rank has come to ends (a live one: every rank not lost,
        standing by or left out); with cluster.min_replicas, the ranks that came to a live
        one past its timeout — or, `timed_out`, every one not come — are left out
        (`_leave_out`)."""
        if not c.live and not timed_out and len(c.came) < self.size:
            return  # a rank still to come (the test below, without its sets)
        came = {r for r, *_ in c.came}
        gone = [r for r in self.lost if r not in came] if c.live else []
        off = len(self.standby) + len(self.joining) + len(self.out - came) if c.live else 0
        if len(came) + len(gone) + off < self.size and not timed_out:
            return
        del self.collectives[k]
        lost_at = max((self.worlds[r].clock for r in gone), default=-math.inf)
        if c.live and self.told:
            lost_at = max(lost_at, self._leave_out(c, came, gone, timed_out))
        done = c.finish(lost_at)
        for lost in sorted(r for r in gone if r not in self.replaced):  # spares take over
            self.replaced.add(lost)
            spare = next((s for s in self.standby if s not in self.back), None)
            if spare is not None:  # a rank back takes no other's place
                self.standby.remove(spare)
                self.joining.append((spare, lost))
        for r in sorted(c.waiters):
            del self.waiting[r]
            self.ready.push(max(self.worlds[r].clock, done), (r, None, None))

    def _leave_out(self, c: Collective, came: set[int], gone: list[int], timed_out: bool):
        """The real runtime's timeout in a live collective `c`: the ranks that came more than
        2 × timeout_s after the first (a collective waits timeout_s for a silent rank, then
        the regroup timeout_s more) — with `timed_out`, also every rank not come — are
        left out, and the others' sum ends no sooner than that wait and their collective
        again; when it ends (-inf when none is left out)."""
        deadline = c.first() + 2 * self.timeout_s
        late = {r for r in came if c.starts[r] > deadline}
        if timed_out:
            away = {*gone, *self.standby, *(s for s, _ in self.joining), *self.out}
            late |= set(range(self.size)) - came - away
        if not late:
            return -math.inf
        self.out |= late
        c.came = [x for x in c.came if x[0] not in late]
        return deadline + max(end - c.starts[r] for r, _, _, end in c.came)

    def _welcome(self) -> None:
        """Once every survivor has come to `welcome`: the chosen spares get its state (as
        the real runtime sends it: saved and loaded) and join, all going on together."""
        spares = {s for s, _ in self.joining}
        expected = [
            r for r in range(self.size)
            if r not in self.lost and r not in spares and r not in self.standby
            and r not in self.results and r not in self.out
        ]  # fmt: skip
        if any(r not in self.welcomed for r in expected):
            return
        data = io.BytesIO()
        torch.save(self.welcomed[expected[0]], data)
        cost = self.worlds[0].network.allreduce_s(data.tell(), 0.0)
        done = max(self.worlds[r].clock for r in [*expected, *spares]) + cost
        for spare, lost in self.joining:
            self.back.discard(spare)
            self.worlds[spare].linked = done  # and the survivors' checkpoint schedule:
            self.worlds[spare].next_checkpoint = self.worlds[expected[0]].next_checkpoint
            # what was on the way to or from it (a rank back) is gone with the old group
            self.cut = {pair for pair in self.cut if spare not in pair}
            for src, dst in [pair for pair in self.mail if spare in pair]:
                del self.mail[(src, dst)]
            self.handoff[spare] = (lost, checkpoint.read(io.BytesIO(data.getvalue()), "welcome"))
            del self.waiting[spare]
            self.worlds[spare].clock = done
            self.issued[spare] = self.issued[expected[0]]
            self.ready.push(done, (spare, None, None))
        for r in expected:
            del self.waiting[r]
            self.worlds[r].clock = done
            self.ready.push(done, (r, None, None))
        self.joining, self.welcomed = [], {}

    def await_(self, rank: int, c: Collective) -> None:
        self.waiting[rank] = Await()
        c.waiters.append(rank)

    def _time_out(self) -> None:
        """Every rank left waits for what will never come: each gets the loss that caused it
        (as a real rank does once its timeout passes), in rank order."""
        if not self.waiting:
            return
        cause = next(iter(self.lost.values()), None)
        for rank in sorted(self.waiting):
            what = self.waiting.pop(rank)
            error = cause or RunError(
                f"rank {rank} waits forever ({what.name}): every other rank ended or waits too"
            )
            if isinstance(what, Listen):
                self.listeners[rank].due = math.inf
            self.ready.push(self.worlds[rank].clock, (rank, RunError(str(error)), None))


def simulate(program: Program, job: Job, run_dir: Path, size: int) -> dict[str, Any]:
    """Run every rank of `program` on the virtual clock; the run's summary."""
    return Simulator(job, run_dir, size).run(program)

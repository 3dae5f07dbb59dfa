"""The world one rank of a run sees, the same in both runtimes: its clock, its compute step
(the profile's time), its faults, point-to-point messages and collectives.

An engine writes each of its roles once, as a program against a `World`:

    def program(self, job, world):
        ...
        grad, compute_s = yield from world.compute(lambda: net.gradient_at(...))
        work = yield from world.isend(message, peer)
        waited_s = yield from world.recv(buf, peer)
        yield from world.all_reduce(buf)
        ...
        return world.record.finish(...) if world.record else None

Every operation that may wait for another rank is a generator, taken with `yield from`
(`strike`, whose pauses wait for no one, is a plain call): in the real runtime
(`RealWorld`) it blocks over gloo and never suspends the program; in the simulator
(`stalebench.runtime.sim`) it suspends the program until the event it waits for, on a
virtual clock, while the other ranks of the run go on in the same process. A program
never asks which runtime it is in.

The network is paid inside the world, as the network model says (`runtime.network`, one
model for both runtimes): a send the push direction's delay for its size (one send after
the other), a receive the pull direction's once the message is in, an all-reduce the ring's
time, each slowed by the rank's `slow` faults in force (`faults`, set once the program has
built them). A hub (a parameter server: `hub = True`) has one NIC for all its peers: the
messages that reach it queue on its downlink, its sends on its uplink. `wire_s` adds up
what this rank's messages and collectives took on the wire, for an engine to report; what
an engine exchanges only to measure (`seconds=0.0`) costs nothing.

A rank that hears from many peers in whatever order they send (a server) listens to them
(`listen`): the next message from any of them, a lost one's loss in its place.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Generator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from stalebench.errors import RunError
from stalebench.metrics.events import EventLog
from stalebench.runtime import checkpoint
from stalebench.runtime.faults import Faults, Shaped, Waits, WorkerDied, pad_to
from stalebench.runtime.network import Calendars, Link, Network, Topology
from stalebench.runtime.quorum import Live, Quorum, Rounds
from stalebench.runtime.receiver import Inbox
from stalebench.runtime.transport import Transport

if TYPE_CHECKING:
    from stalebench.cluster import Profile
    from stalebench.runtime.record import RunRecord

T = TypeVar("T")
Op = Generator[Any, Any, T]  # what a world's waiting operation is: `yield from` it
Pause = Callable[[float, float], None]  # pause(at, seconds)
PATIENT = timedelta(days=1)  # a receive that waits as long as the run lasts (a spare's)
OVERRUN_KEY = "overrun"  # the store's keys of each rank's steps that ran long (`tell_overrun`)
DIED_KEY = "died"  # the store's keys of the ranks an injected fault killed: when (`died_at`)
# how long the ranks wait in the store for each other to be past their warm-up, before the
# start's all-reduce (which then says who is missing): a loaded machine's imports and first
# steps are no silence during the run, which timeout_s bounds
WARM_UP_S = 300.0


def nbytes(buf: torch.Tensor) -> int:
    return buf.numel() * buf.element_size()


def blocking(fn: Callable[..., T]) -> Callable[..., Op[T]]:
    """A real world's operation as a generator that never suspends, so that programs take
    every waiting operation with `yield from`, whichever runtime they run in."""

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Op[T]:
        return fn(*args, **kwargs)
        yield  # unreachable: makes `op` a generator function

    return op


class World:
    """What one rank sees. `rank` and `size` place it in the run; `record` is the run
    directory on rank 0 (None elsewhere); `faults` the scheduled faults of the worker this
    rank plays, which the program builds and sets (they slow its messages)."""

    rank: int
    size: int
    profile: Profile
    run_dir: Path  # the run directory (each rank's own, with torchrun across machines)
    record: RunRecord | None
    faults: Faults | None = None  # the worker's this rank plays (`play`)
    # a parameter server's rank: one NIC for all its peers, whose messages queue on it
    hub = False
    # the run's hubs, known to every rank once `begin` has passed: a message from a hub
    # costs its receiver the pull time, one from a peer only its downlink's queue
    hubs: frozenset[int] = frozenset()
    network: Network  # what messages and collectives cost (`runtime.network`)
    # seconds this rank's messages and collectives took on the wire so far, as modelled:
    # its sends' push time, its receives' pull time, its collectives' time (not what it
    # waited for the others); an engine reports communication from it
    wire_s = 0.0

    def now(self) -> float:
        """Run time: seconds since every rank started (real or virtual)."""
        raise NotImplementedError

    def play(self, worker: int, since: float = 0.0, step: int = 0, replaced: bool = False):
        """This rank plays `worker` from run time `since` and the worker's step `step` on
        (`replaced`: in a lost worker's place): the profile's faults of that worker strike
        its steps (`strike`) and slow its messages. They are kept with this rank's part of
        each checkpoint and are back, as they were, in a resumed run (`begin`)."""
        self.faults = Faults(self.profile, worker, since, step, replaced=replaced)

    @property
    def events(self) -> EventLog:
        """The run's events.jsonl, for a rank that writes its own events (rank 0's is
        `record.events`; the others append to the same file once `begin` has passed)."""
        raise NotImplementedError

    def shared(self, key: str, build: Callable[[], T]) -> T:
        """An object the ranks of this process share, built once (a real process holds one
        rank, the simulator all of them: one model to compute every rank's gradients)."""
        raise NotImplementedError

    def mailbox(self, src: int, dst: int, size: int, header: int) -> torch.Tensor:
        """A buffer for the messages `src` sends `dst` (this rank is one of them), read in
        place by the receiver (`Transport.mailbox`)."""
        return torch.zeros(size)

    def message(self, size: int, header: int) -> torch.Tensor:
        """A buffer for one message of `size` float32 slots this rank sends or receives; in
        a cost-only run its `header` slots alone, the wire charged for all `size`."""
        return torch.zeros(size)

    def begin(self, warm_up: Callable[[], Any]) -> Op[None]:
        """Every rank starts the run's clock together: at 0, or in a resumed run at its
        checkpoint's time, each rank then finding its part of a checkpoint set in `resumed`;
        `warm_up` (a first step, off the clock) runs before where it costs real time."""
        raise NotImplementedError

    # this rank's part of the checkpoint set the run goes on from (`checkpoint`), once
    # `begin` has passed; None in a run from the start, and for a rank that took no part
    # (lost before it, or a spare standing by): it stands by as a spare
    resumed: Any = None
    resumed_from = -1  # the version of that set (-1: a run from the start)
    every_s = 0.0  # run seconds between checkpoints (`checkpoint.every_s`); 0: none
    next_checkpoint = math.inf

    def checkpoint_due(self, t: float) -> bool:
        """Whether a checkpoint falls due at run time `t`: `every_s` after the last (or the
        start). Every rank that asks gets the same answer for the same `t`."""
        return t >= self.next_checkpoint

    def checkpoint_taken(self, t: float) -> None:
        """The checkpoint due by run time `t` is taken: the next falls due `every_s` after."""
        self.next_checkpoint = t + self.every_s

    def checkpoint(self, version: int, part: Any, t: float, live: bool = False) -> Op[None]:
        """Every rank at once, at the same point of the run (a round's end, nothing in
        flight): `part`, what this rank needs to go on from here (its θ, optimizer state,
        worker; the random generator's state and the faults are added here), to the run
        directory;
        once every rank's part is on disk, rank 0 commits the set (`checkpoint.Checkpoints`),
        so that a kill at any moment leaves the last complete set. `t`: the run time the
        checkpoint was due by (the next falls due `every_s` after it); `live`: over the
        ranks in the rounds (cluster.min_replicas: spares standing by take no part)."""
        run_dir = self.run_dir
        saved = {"part": part, "rng": rng_state(), "faults": self.faults}
        checkpoint.save_part(run_dir, version, self.rank, saved)
        self.checkpoint_taken(t)
        barrier, ranks = torch.zeros(1), list(range(self.size))
        if live:  # the ranks in the rounds: those that wrote a part
            ranks = yield from self.all_reduce_live(barrier, 0.0)
        else:
            yield from self.all_reduce(barrier, 0.0)
        if self.record is not None:
            state = {"parts": version, "due": t, "ranks": ranks}
            self.record.checkpoints.save(self.now(), version, state)
            checkpoint.prune_parts(run_dir, version)

    def _resume_from(self, version: int, due: float, ranks: list[int]) -> None:
        """`begin` in a resumed run (`version` ≥ 0: the checkpoint set's, which `ranks`
        wrote): this rank's part and random generator back, the next checkpoint `every_s`
        after the last."""
        self.next_checkpoint = due + self.every_s if self.every_s > 0 else math.inf
        self.resumed_from = version
        if version >= 0 and self.rank in ranks:
            saved = checkpoint.load_part(self.run_dir, version, self.rank)
            set_rng_state(saved["rng"])
            self.resumed, self.faults = saved["part"], saved["faults"]

    def _start_of(self) -> tuple[float, int, float, list[int]]:
        """Rank 0: when the run starts (a resumed run's checkpoint time), the version of
        its checkpoint set (-1: none, or a server's checkpoint), when the checkpoint fell
        due, and the ranks that wrote the set."""
        saved = self.record.resumed if self.record is not None else None
        if not saved:
            return 0.0, -1, 0.0, list(range(self.size))
        state = saved["state"]
        if not isinstance(state, dict) or "parts" not in state:  # a server's checkpoint
            return saved["t"], -1, saved["t"], list(range(self.size))
        return saved["t"], state["parts"], state["due"], state["ranks"]

    def strike(self, on_pause: Pause | None = None) -> float:
        """Strike this rank's faults due at its next step (`Faults.strike`): a pause calls
        `on_pause(at, seconds)`, then waits; a death raises `WorkerDied`. Returns the
        seconds paused. A plain call, not an operation to `yield from`: a pause waits for
        nothing another rank does (real processes sleep it; in the simulator it moves the
        rank's clock, and the rank's next waiting operation takes its turn)."""
        raise NotImplementedError

    def died_at(self, rank: int) -> float | None:
        """When `rank` died of an injected fault (run time), if it did: real processes say
        so before they end, so that a death just before the run's end, heard only after
        it, is still the run's loss; None in the simulator, which hears every loss at its
        time."""
        return None

    def compute(
        self, step: Callable[[], T], step_s: float, lazy: bool = False
    ) -> Op[tuple[T | None, float]]:
        """Run `step` (a gradient), lasting at least `step_s` (the profile's step time);
        returns its result and the seconds it took. `lazy`: the program does not use the
        result: `step` writes into the message this rank sends next and reads only what
        this rank's own steps change. The simulator then runs it when that message is first
        read, or before this rank's next step or collective, never if neither comes (a
        step under way when the run ends), and returns None for it; real processes run it
        now."""
        raise NotImplementedError

    def isend(self, buf: torch.Tensor, dst: int) -> Op[Any]:
        """Send `buf` to rank `dst` without waiting for it to arrive, after the push delay;
        `buf` stays unchanged until `wait` on the returned handle."""
        raise NotImplementedError

    def wait(self, work: Any, dst: int) -> Op[None]:
        """Wait until the send `work` to `dst` is delivered."""
        raise NotImplementedError

    def send(self, buf: torch.Tensor, dst: int) -> Op[None]:
        """`isend`, then `wait`."""
        yield from self.wait((yield from self.isend(buf, dst)), dst)

    def recv(self, buf: torch.Tensor, src: int, patient: bool = False) -> Op[float]:
        """Receive the next message from rank `src` into `buf`, then pay the pull delay;
        returns the seconds waited for the message to arrive (not counting the delay). It
        waits at most timeout_s, or as long as the run lasts when `patient` (a spare)."""
        raise NotImplementedError

    def listen(self, peers: dict[int, int], make: Callable[[int], list[torch.Tensor]]):
        """A `Listener` to `peers` (the program's name for each → its rank); `make(rank)`
        gives the buffers a message from that rank is received into."""
        raise NotImplementedError

    def all_reduce(
        self, buf: torch.Tensor, seconds: float | None = None, wait: bool = True,
        nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """Sum `buf` over every rank, in place (the simulator sums in rank order); it lasts
        the network's ring all-reduce time for `nbytes` (what the wire carries; default
        `buf`'s size), as slowed by this rank's faults, from this rank's start — or
        `seconds` when given (0: the harness's own exchange, free; or a time the runtime
        worked out, `pieces`) — or the real transfer's if that is longer. Returns the
        seconds this rank waited for it; with `wait=False`, at once a handle for `complete`,
        the collective going on while the rank computes (`buf` untouched until then). A
        rank's collectives run in the order it starts them (`collectives_end`)."""
        raise NotImplementedError

    def collectives_end(self) -> float:
        """The run time at which this rank's collectives started so far end, as the
        network model has them (not waiting for the other ranks)."""
        raise NotImplementedError

    def _slow_s(self) -> float:
        """What the `slow` faults in force add to each message this rank sends."""
        return self.faults.slow_s if self.faults is not None else 0.0

    def _priced(self, seconds, size: int | None, price, buf=None) -> float | None:
        """A collective's seconds: `seconds` as given, else the network's `price` of `size`
        bytes on the wire (default: `buf`'s size) as slowed by this rank's faults; None
        when neither is given (the transport prices its buffer itself)."""
        if seconds is not None:
            return seconds
        if size is None and buf is not None:
            size = nbytes(buf)
        return None if size is None else price(size, self._slow_s())

    def all_reduce_live(
        self, buf: torch.Tensor, seconds: float | None = None, wait: bool = True,
        nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """`all_reduce` over the ranks still alive: a rank lost before or during it (dead,
        or silent past timeout_s) is left out, the others agreeing on who is left (a quorum)
        and summing their buffers as they brought them — unless a survivor had completed
        it before the loss (real processes: the lost rank's data had reached it), when
        every survivor takes that sum, over the ranks it had. Returns the ranks summed, in
        order; a rank itself left out (silent too long) gets a RunError. Every rank of the
        run calls it, the same number of times, as it does `all_reduce`. With `wait=False`,
        a handle for `complete` (its `members`, the ranks summed, once complete): a loss
        found while several are under way sums again, over the ranks left, every one of
        them not yet complete, in the order they were started."""
        raise NotImplementedError

    # spares chosen by the last `all_reduce_live` to take lost ranks' places: (spare rank,
    # the lost rank), each to join at the survivors' next `welcome`
    joining: list[tuple[int, int]] = []

    def welcome(self, state: Any) -> Op[None]:
        """The survivors, at the end of a round whose `all_reduce_live` chose spares
        (`joining`): the rounds from here run over them and those spares, which get `state`
        (a picklable object, from the lowest survivor)."""
        raise NotImplementedError

    def stand_by(self) -> Op[tuple[int, Any] | None]:
        """A spare (after `begin`): off the rounds until chosen to take a lost rank's place
        — returns (that rank, the state `welcome` sent) — or until the run ends (None)."""
        raise NotImplementedError

    def release_spares(self) -> None:
        """Rank 0, at the end: the spares still standing by end."""

    def all_gather(
        self, out: list[torch.Tensor], buf: torch.Tensor, seconds: float | None = None,
        wait: bool = True, nbytes: int | None = None,
    ) -> Op[Any]:  # fmt: skip
        """Every rank's `buf` into `out` (one tensor per rank, in rank order), as
        `all_reduce` (its time: the network's ring all-gather of `nbytes` per rank)."""
        raise NotImplementedError

    def complete(self, handle: Any) -> Op[float]:
        """Wait for a collective started with `wait=False`; the seconds waited."""
        raise NotImplementedError

    def pieces(
        self, buf: torch.Tensor, bounds: list[tuple[int, int]], order: list[int],
        ready: list[float], forward: list[tuple[float, list[int]]] | None = None,
    ) -> Any:  # fmt: skip
        """A round's all-reduce of `buf` in pieces (`bounds`: their ranges), each issued once
        it is written and the pieces before it in `order` (the same on every rank) are.
        With `hooked` true (real processes, `runtime.link.Pieces`) a compute step's backward
        hooks `post(k, round)` each piece as it is made; `wait(k)` waits for a piece's sum
        at once (inside a step), `settle()` (an op) for every piece of the round,
        `waited` counts the seconds waited, `close()` waits for what is under way. On a
        virtual clock a step takes no time and nothing is posted (`hooked` false): the
        round is one all-reduce of `buf` lasting `comm_s(step_s, slow_s)` past the step,
        what the pieces, made at `ready` (fractions of the step) and all-reduced one after
        another in `order`, would take — or, given `forward` (P3: each module's share of a
        step in the forward pass, in its order, and the pieces holding its tensors), what
        the next forward pass waits for them; `wait` is refused."""
        raise NotImplementedError

    def pace(self, net: torch.nn.Module, params: list[torch.Tensor], work=None) -> Any:
        """Hooks on `net` that spread a step's modelled time over its forward and backward
        passes, by each tensor's `work` (default: its size), so that pieces posted from
        backward overlap the modelled computation (`runtime.link.Pace`: `start(step_s)`,
        `backward()`); None where a step takes no time (the simulator)."""
        return None


class RealWorld(World):
    """A process of the real runtime: gloo messages through the profile's `Shaped` network,
    time by `time.perf_counter` from the barrier that starts the run."""

    def __init__(
        self,
        rank: int,
        size: int,
        transport: Transport,
        profile: Profile,
        record,
        run_dir: Path,
        timeout_s: float,
        store: Any = None,
        spares: int = 0,
        every_s: float = 0.0,
        links_dir: Path | None = None,
    ):
        self.rank, self.size, self.profile, self.record = rank, size, profile, record
        self.transport, self.timeout_s = transport, timeout_s
        active = size - spares
        self.network = Network(profile.cfg, _topology(profile.cfg, size, links_dir))
        self.net = Shaped(transport, self.network, rank=rank)
        # its NIC, on perf_counter's clock: a hub's both ways, a peer's downlink
        self.up, self.down = Link(), Link()
        self.departures: dict[int, Departures] = {}  # a hub's sends that wait for its uplink
        self.quorum, self.rounds = None, None  # the ranks left; the live collectives
        if store is not None:
            self.quorum = Quorum(store, rank, size, timeout_s, active)
            self.rounds = Rounds(self.quorum, transport, self.net.all_reduce_start)
        self.store, self.steps, self.overran, self.told_at = store, 0, 0, 0.0
        # a hub's handling of the messages it took: from taking one to asking for the next
        self.handled, self.handling_s, self.took_at = 0, 0.0, None
        # and the CPU its process spent (every thread: receiving, handling, replying) from
        # its first message taken to its last: (process_time, messages) at each end
        self.cpu_first: tuple[float, int] | None = None
        self.cpu_last: tuple[float, int] | None = None
        # a stepping rank's steps, and its process CPU (every thread) and wall time at its
        # first step's start and at its latest's: (process_time, perf_counter)
        self.cycles = 0
        self.cycle_first: tuple[float, float] | None = None
        self.cycle_last: tuple[float, float] | None = None
        self.t0 = time.perf_counter()
        self._shared: dict[str, Any] = {}
        self._events = record.events if record is not None else None
        self.run_dir, self.every_s = run_dir, every_s

    @property
    def events(self) -> EventLog:
        if self._events is None:
            self._events = EventLog(self.run_dir / "events.jsonl")
        return self._events

    def close(self) -> None:
        """Close what this rank opened (its own events.jsonl handle), once a hub's sends
        still waiting for its uplink have left."""
        for departures in self.departures.values():
            departures.close()
        self.tell_overrun()  # the uplink's waits too
        if self._events is not None and self.record is None:
            self._events.close()

    @property
    def faults(self) -> Faults | None:  # type: ignore[override]
        return self.net.faults

    @faults.setter
    def faults(self, faults: Faults | None) -> None:
        self.net.faults = faults

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def shared(self, key: str, build: Callable[[], T]) -> T:
        if key not in self._shared:
            self._shared[key] = build()
        return self._shared[key]

    @property
    def link(self) -> Transport:
        """The transport this rank's messages go through: the network's, or a hub's own
        (its NIC's queues are paid here: `_leave`, `_deliver`)."""
        return self.transport if self.hub else self.net

    @property
    def wire_s(self) -> float:  # type: ignore[override]
        return self.net.wire_s

    def _leave(self, buf: torch.Tensor, dst: int) -> Any:
        """A hub's send leaves once its uplink is free of the sends before it: at once, or
        from its NIC's thread (`Departures`) while the hub goes on; over a topology, once it
        would be across the shared links (a thread per receiver: one far away holds back
        no other)."""
        now, size = time.perf_counter(), nbytes(buf)
        wire = self.network.pull_wire_s(size)
        at = self.up.leave(now, wire)
        at += self.network.cross(self.rank, dst, size, at + wire, wire)
        key = dst if self.network.topology is not None else 0
        if at <= now and (key not in self.departures or self.departures[key].idle()):
            return self.transport.isend(buf, dst)
        if key not in self.departures:
            self.departures[key] = Departures(self.transport, self.net.waits)
        self.departures[key].put(at, buf, dst, at - now)
        return None

    def _deliver(self, size: int) -> None:
        """A message of `size` bytes that reached a hub now is through its downlink once
        the messages before it are (`Link.take`)."""
        now = time.perf_counter()
        through = self.down.take(now, self.network.push_wire_s(size))
        self.net.waits.until(through, through - now)

    def mailbox(self, src: int, dst: int, size: int, header: int) -> torch.Tensor:
        return self.transport.mailbox(src, dst, size, header)

    def _warm(self) -> None:
        """Wait in the store until every rank is past its warm-up (at most `WARM_UP_S`, or
        until one is marked dead), so that the start's all-reduce, bounded by timeout_s,
        does not time out on a rank that is only slow to start."""
        if self.store is None:
            return
        self.store.set(f"warm/{self.rank}", "1")
        keys = [f"warm/{r}" for r in range(self.size)]
        deadline, polls = time.monotonic() + WARM_UP_S, 0
        while not self.store.check(keys) and time.monotonic() < deadline:
            polls += 1  # a dead rank looked for every 0.5 s (a request a rank: not each poll)
            if polls % 50 == 0 and any(self.store.check([f"dead/{r}"]) for r in range(self.size)):
                return  # the all-reduce says so
            time.sleep(0.01)

    @blocking
    def begin(self, warm_up: Callable[[], Any]) -> None:
        warm_up()
        # what the rank built before its start (torch's modules, the job, the data) is
        # kept out of the collector's full passes, which cost nothing then (a full pass
        # over torch with torch._dynamo: 280,000 objects, 0.4 s): one came a second or two
        # into a run, its rank stalled while its peers waited (DiLoCo on 2 workers: 6-12
        # rounds in that half second against 24-30 in the others; SGP: 39 updates
        # against about 150)
        gc.freeze()
        logging.getLogger("stalebench").info(
            "rank %d: %d objects of its start kept out of the collector's passes",
            self.rank,
            gc.get_freeze_count(),
        )
        self._warm()
        start = torch.zeros(3 + 2 * self.size, dtype=torch.float64)
        if self.rank == 0:
            at, version, due, ranks = self._start_of()
            start[:3] = torch.tensor([at, version, due], dtype=torch.float64)
            start[3 + torch.tensor(ranks, dtype=torch.long)] = 1.0
        start[3 + self.size + self.rank] = float(self.hub)  # every rank learns the hubs
        self.transport.all_reduce(start)  # every rank is here: rank 0's start
        at, version, due = start[:3].tolist()
        ranks = [r for r in range(self.size) if start[3 + r] > 0]
        self.hubs = frozenset(r for r in range(self.size) if start[3 + self.size + r] > 0)
        self._resume_from(int(version), due, ranks)
        if version >= 0 and self.quorum is not None:
            self.quorum.resume(ranks)  # those that wrote no part stand by
        self.t0 = time.perf_counter() - at

    def strike(self, on_pause: Pause | None = None) -> float:
        assert self.faults is not None, "set world.faults before its first step"

        def pause(at: float, seconds: float) -> None:
            if on_pause is not None:
                on_pause(at, seconds)
            time.sleep(seconds)

        now = self.now()
        try:
            return self.faults.strike(now, pause) - now
        except WorkerDied as died:  # said before the process ends (`died_at`)
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.set(f"{DIED_KEY}/{self.rank}", repr(died.at_s))
            raise

    def died_at(self, rank: int) -> float | None:
        if self.store is None or not self.store.check([f"{DIED_KEY}/{rank}"]):
            return None
        return float(self.store.get(f"{DIED_KEY}/{rank}").decode())

    @blocking
    def compute(self, step: Callable[[], T], step_s: float, lazy: bool = False):
        start = time.perf_counter()
        self.cycle_last, self.cycles = (time.process_time(), start), self.cycles + 1
        self.cycle_first = self.cycle_first or self.cycle_last
        out = step()
        if step_s > 0:  # a step the profile times: did the machine keep to it?
            self.steps += 1
            self.overran += time.perf_counter() - start > step_s
            if start - self.told_at > 1.0:
                self.tell_overrun()
        pad_to(start, step_s)
        return out, time.perf_counter() - start

    def cycle_s(self) -> tuple[int, float, float]:
        """A stepping rank's steps between its first and latest, and its process CPU and
        wall seconds over them ((0, 0, 0) before its second step)."""
        if self.cycles < 2:
            return 0, 0.0, 0.0
        (c0, w0), (c1, w1) = self.cycle_first, self.cycle_last
        return self.cycles - 1, c1 - c0, w1 - w0

    def tell_overrun(self) -> None:
        """This rank's profiled steps and those that ran longer than drawn, its network
        waits and those that woke late (`faults.Waits`), its CPU and wall time over its
        steps (`cycle_s`), to the run's store, where the launcher adds them up into
        summary.json (`overrun`, `hub`, `cycle`)."""
        self.told_at = time.perf_counter()
        waits, (cycles, cpu_s, wall_s) = self.net.waits, self.cycle_s()
        if self.store is not None and (self.steps or self.handled or waits.count or cycles):
            told = (f"{self.steps} {self.overran} {self.handled} {self.handling_s!r} "
                    f"{self.cpu_per_message_s()!r} {waits.count} {waits.late} "
                    f"{cycles} {cpu_s!r} {wall_s!r}")  # fmt: skip
            with contextlib.suppress(Exception):  # the store gone: the run is ending
                self.store.set(f"{OVERRUN_KEY}/{self.rank}", told)

    @blocking
    def isend(self, buf: torch.Tensor, dst: int) -> Any:
        return self._leave(buf, dst) if self.hub else self.link.isend(buf, dst)

    @blocking
    def wait(self, work: Any, dst: int) -> None:
        if work is not None:  # None: it leaves from a hub's NIC thread
            self.link.wait(work, dst)

    @blocking
    def recv(self, buf: torch.Tensor, src: int, patient: bool = False) -> float:
        # a hub's message: the pull delay, slept once it is in; a peer's: its sender's push
        # was its transfer, and it is through once this rank's downlink is free of the ones
        # before it
        pull = not self.hub and src in self.hubs
        pull_s = self.network.pull_s(nbytes(buf)) if pull else 0.0
        self.asking()
        start = time.perf_counter()
        if self.hub:
            self.link.recv(buf, src, PATIENT if patient else None)
            self._deliver(nbytes(buf))
            self.took()
        else:
            self.net.recv(buf, src, PATIENT if patient else None, pay=pull)
            if not pull:
                now = time.perf_counter()
                through = self.network.peer_through(self.down, now, nbytes(buf))
                self.net.waits.until(through, through - now)
        return max(time.perf_counter() - start - pull_s, 0.0)

    def asking(self) -> None:
        """A hub asks for its next message: its handling of the last one is over."""
        if self.took_at is not None:
            self.handling_s += time.perf_counter() - self.took_at
            self.took_at = None

    def took(self) -> None:
        self.handled, self.took_at = self.handled + 1, time.perf_counter()
        self.cpu_last = (time.process_time(), self.handled)
        if self.cpu_first is None:
            self.cpu_first = self.cpu_last

    def cpu_per_message_s(self) -> float:
        """The hub process's CPU seconds per message between its first and last taken."""
        if self.cpu_first is None or self.cpu_last[1] == self.cpu_first[1]:
            return 0.0
        return (self.cpu_last[0] - self.cpu_first[0]) / (self.cpu_last[1] - self.cpu_first[1])

    def listen(self, peers: dict[int, int], make: Callable[[int], list[torch.Tensor]]):
        inbox = Inbox(self.transport, peers, make, self.now, self.timeout_s)
        return RealListener(inbox, self if self.hub else None)

    @blocking
    def all_reduce(self, buf: torch.Tensor, seconds=None, wait: bool = True, nbytes=None):
        seconds = self._priced(seconds, nbytes, self.network.allreduce_s)
        pending = self.net.all_reduce_start(buf, seconds)  # the network's time, or gloo's
        return self._complete(pending) if wait else pending

    def collectives_end(self) -> float:
        return self.net.clock.free_at - self.t0

    @blocking
    def all_reduce_live(self, buf: torch.Tensor, seconds=None, wait=True, nbytes=None):
        if self.rounds is None:
            raise RunError("all_reduce_live needs the run's store (a RealWorld made without)")
        live = self.rounds.start(buf, self._priced(seconds, nbytes, self.network.allreduce_s))
        if not wait:
            return live
        self._settle(live)
        return live.members

    def _settle(self, handle: Live) -> float:
        """Wait for the live collectives under way, in the order started, up to `handle`
        (`Rounds.settle`: a peer lost, the survivors agree on who is left and on their
        rounds, and sum again those none completed). The seconds waited."""
        start = time.perf_counter()
        self.rounds.settle(handle)
        return time.perf_counter() - start

    @property
    def joining(self) -> list[tuple[int, int]]:  # type: ignore[override]
        return self.rounds.joining if self.rounds is not None else []

    @blocking
    def welcome(self, state: Any) -> None:
        self.quorum.welcome(self.transport, state, self.rounds.started)
        self.rounds.joining = []

    @blocking
    def stand_by(self) -> tuple[int, Any] | None:
        got = self.quorum.stand_by(self.transport)
        if got is None:
            return None
        lost, state, self.rounds.started = got  # the survivors' count of live collectives
        return lost, state

    def release_spares(self) -> None:
        if self.quorum is not None:
            self.quorum.release()

    @blocking
    def all_gather(self, out, buf: torch.Tensor, seconds=None, wait=True, nbytes=None):
        seconds = self._priced(seconds, nbytes, self.network.allgather_s)
        pending = self.net.all_gather_start(out, buf, seconds)
        return self._complete(pending) if wait else pending

    @blocking
    def complete(self, handle: Any) -> float:
        return self._settle(handle) if isinstance(handle, Live) else self._complete(handle)

    def pieces(self, buf, bounds, order, ready, forward=None):
        from stalebench.runtime.link import Pieces

        return Pieces(self.net, buf, bounds, order)

    def pace(self, net, params, work=None):
        from stalebench.runtime.link import Pace

        return Pace(net, params, work)

    def _complete(self, pending: Any) -> float:
        start = time.perf_counter()
        pending.wait()
        return time.perf_counter() - start


class Departures:
    """A hub's uplink in real processes: the sends that must wait for it leave from one
    thread, in order, each at its time (perf_counter seconds). A hub writes a peer's buffer
    again only once that peer has replied (the mailbox contract, `Transport.mailbox`), so the
    buffer is sent as it is then. A send that fails (the peer lost) is dropped: the hub's
    listener hears of the loss."""

    def __init__(self, transport: Transport, waits: Waits):
        self.transport, self.waits = transport, waits
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="hub-uplink", daemon=True)
        self.thread.start()

    def idle(self) -> bool:
        return self.queue.unfinished_tasks == 0

    def put(self, at: float, buf: torch.Tensor, dst: int, seconds: float) -> None:
        """Send `buf` to `dst` at perf_counter's `at`, `seconds` from now in the model."""
        self.queue.put((at, buf, dst, seconds))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                at, buf, dst, seconds = item
                self.waits.until(at, seconds)
                try:
                    self.transport.wait(self.transport.isend(buf, dst), dst)
                except Exception:  # noqa: BLE001 (a lost peer: the listener reports it)
                    pass
            finally:
                self.queue.task_done()

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


class Listener:
    """A rank's ear to its peers (`World.listen`)."""

    def next(
        self, active: set[int], until: float = 0.0, read: bool = True
    ) -> Op[tuple[int, list] | None]:
        """The next message from a peer in `active`: (peer, its buffers, read in place until
        the reply to it); None when run time `until` (> 0) passes first. A lost or silent
        peer raises `WorkerLost` (a real peer silent for timeout_s after `arm`). `read`:
        False when the caller will not read the message (it only learns who sent one)."""
        raise NotImplementedError

    def arm(self, peer: int) -> None:
        """This rank awaits the peer's next message (it replied): its silence counts."""

    def close(self, peer: int) -> None:
        """No longer listen to the peer (told to stop, or lost)."""

    def replace(self, peer: int, rank: int) -> None:
        """The peer is rank `rank` from now on (a spare in a lost worker's place)."""


class RealListener(Listener):
    """A thread per peer, each waiting on its messages (`Inbox`); a hub's messages then
    pass its downlink (`RealWorld._deliver`), in the order it takes them, and its handling
    of each is timed."""

    def __init__(self, inbox: Inbox, hub: RealWorld | None = None):
        self.inbox, self.hub = inbox, hub
        inbox.start()

    @blocking
    def next(self, active: set[int], until: float = 0.0, read: bool = True):
        if self.hub is not None:
            self.hub.asking()
        got = self.inbox.next(active, until)
        if got is not None and self.hub is not None:
            self.hub._deliver(sum(nbytes(b) for b in got[1]))
            self.hub.took()
        return got

    def arm(self, peer: int) -> None:
        self.inbox.receivers[peer].arm(self.inbox.now())

    def close(self, peer: int) -> None:
        self.inbox.receivers[peer].close()

    def replace(self, peer: int, rank: int) -> None:
        self.inbox.replace(peer, rank)


LINKS_FILE = "links"  # the topology's shared links' bookings, beside the mailboxes


def _topology(cfg, size: int, links_dir: Path | None) -> Topology:
    """The run's topology, its shared links' bookings in the machine's shared memory
    (`links_dir`, every rank of the run maps it), or this process's own without one."""
    topology = Topology(cfg, size)
    if not topology.flat:
        if links_dir is not None:
            topology.calendars = Calendars.shared(links_dir / LINKS_FILE, topology.links, size)
        else:
            topology.calendars = Calendars.local(topology.links, size)
    return topology


def rng_state() -> dict[str, Any]:
    """The process's random generators (dropout draws from them), for a checkpoint."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def run_program(program: Op[T]) -> T:
    """Run a program in the real world, where no operation suspends it."""
    try:
        program.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a program suspended in the real runtime: its world is not a RealWorld")

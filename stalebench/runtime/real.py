"""The real runtime's world (`World`, `runtime.world`): a rank per process, its messages
and collectives over a gloo `Transport` shaped by the network model (`faults.Shaped`), its
clock `time.perf_counter`'s from the barrier that starts the run, its quorum of live ranks
and spares in the run's store (`quorum`); `run_program` runs a rank's program in it."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stalebench import placement
from stalebench.errors import RunError
from stalebench.metrics.events import EventLog
from stalebench.runtime.faults import Faults, Shaped, Waits, WorkerDied, pad_to
from stalebench.runtime.network import Calendars, Link, Network, Topology
from stalebench.runtime.quorum import Live, Quorum, Rounds
from stalebench.runtime.receiver import Inbox
from stalebench.runtime.transport import Transport
from stalebench.runtime.world import Listener, Op, Pause, T, World, blocking, nbytes

if TYPE_CHECKING:
    from stalebench.cluster import Profile

PATIENT = timedelta(days=1)  # a receive that waits as long as the run lasts (a spare's)
OVERRUN_KEY = "overrun"  # the store's keys of each rank's steps that ran long (`tell_overrun`)
DIED_KEY = "died"  # the store's keys of the ranks an injected fault killed: when (`died_at`)
# how long the ranks wait in the store for each other to be past their warm-up, before the
# start's all-reduce (which then says who is missing): a loaded machine's imports and first
# steps are no silence during the run, which timeout_s bounds
WARM_UP_S = 300.0


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
        device: torch.device | None = None,
    ):
        self.rank, self.size, self.profile, self.record = rank, size, profile, record
        self.device = device if device is not None else torch.device("cpu")
        placement.use(self.device)  # once, as DDP's set_device
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
        self._placed: list[dict[str, Any]] = []  # rank 0: each rank's host and device
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
        network = self.network.between(self.rank, dst)  # to a rank of its host: the link
        wire = network.pull_wire_s(size)
        at = network.leave(self.up, now, wire)
        at += network.cross(self.rank, dst, size, at + wire, wire)
        key = dst if self.network.topology is not None else 0
        if at <= now and (key not in self.departures or self.departures[key].idle()):
            return self.transport.isend(buf, dst)
        if key not in self.departures:
            self.departures[key] = Departures(self.transport, self.net.waits)
        self.departures[key].put(at, buf, dst, at - now)
        return None

    def _deliver(self, size: int, src: int) -> None:
        """A message of `size` bytes from rank `src` that reached a hub now is through its
        downlink once the messages before it are (`Link.take`; from a rank of its host:
        over the link, at once)."""
        now, network = time.perf_counter(), self.network.between(src, self.rank)
        through = network.take(self.down, now, network.push_wire_s(size))
        self.net.waits.until(through, through - now)

    def mailbox(self, src: int, dst: int, size: int, header: int) -> torch.Tensor:
        return self.transport.mailbox(src, dst, size, header, self.device.type == "cuda")

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
        if self.store is not None:  # where it computes, for rank 0's summary.json
            here = placement.placed(self.rank, self.device)
            self.store.set(f"placed/{self.rank}", json.dumps(here))
        self._warm()
        if self.rank == 0 and self.store is not None:  # each set before its warm key
            keys = [f"placed/{r}" for r in range(self.size)]
            self._placed = [json.loads(self.store.get(k)) for k in keys if self.store.check([k])]
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

    def placed(self) -> list[dict[str, Any]]:
        return self._placed or super().placed()  # read at the start (`begin`)

    def strike(self, on_pause: Pause | None = None) -> float:
        assert self.faults is not None, "world.play(worker) before its first step"

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
        network = self.network.between(src, self.rank)
        pull_s = network.pull_s(nbytes(buf)) if pull else 0.0
        self.asking()
        start = time.perf_counter()
        if self.hub:
            self.link.recv(buf, src, PATIENT if patient else None)
            self._deliver(nbytes(buf), src)
            self.took()
        else:
            self.net.recv(buf, src, PATIENT if patient else None, pay=pull)
            if not pull:
                now = time.perf_counter()
                through = network.peer_through(self.down, now, nbytes(buf))
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
        self.quorum.welcome(self.transport, state, self.rounds.started, self.next_checkpoint)
        self.rounds.joining = []

    def invite(self, vacant: list[int]) -> bool:
        return self.quorum is not None and self.quorum.invite(vacant)

    def invited(self) -> None:
        self.rounds.joining = list(self.quorum.invited())

    @blocking
    def stand_by(self) -> tuple[int, Any] | None:
        got = self.quorum.stand_by(self.transport)
        if got is None:
            return None
        lost, state, started, self.next_checkpoint = got  # the survivors' schedule
        self.rounds.reset(started)  # the survivors' count of live collectives
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

    def pieces(self, buf, bounds, order, ready, forward=None, spans=None, sizes=None):
        from stalebench.runtime.link import Pieces

        return Pieces(self.net, buf, bounds, order, spans)

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
            src = self.inbox.receivers[got[0]].rank
            self.hub._deliver(sum(nbytes(b) for b in got[1]), src)
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


def run_program(program: Op[T]) -> T:
    """Run a program in the real world, where no operation suspends it."""
    try:
        program.send(None)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a program suspended in the real runtime: its world is not a RealWorld")

"""The cluster profile as a wrapper around what an engine does, the way torchft wraps a
process group: a transport that pays the network model's delays (`runtime.network`), and a
worker's compute step that strikes its scheduled faults and lasts the profile's step time.

The same objects serve both runtimes. In the real runtime a delay is a sleep and a dead
worker's process exits with `FAULT_EXIT`; in the simulator the engine adds the same
seconds to its virtual clock and a death raises `WorkerDied` in its rank; what follows is
the engine's (a spare takes the place, the others regroup above `cluster.min_replicas`, or
the run fails).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch

from stalebench.cluster import STEP_ACTIONS, FaultConfig, Profile
from stalebench.errors import RunError
from stalebench.registry import stored
from stalebench.runtime.network import Network
from stalebench.runtime.transport import Pending, Transport

FAULT_EXIT = 3  # exit code of a process that an injected fault killed


class WorkerLost(RunError):
    """A worker is gone (dead, or silent past timeout_s): a barrier-free algorithm goes on
    without it, any other run fails."""

    def __init__(self, worker: int, message: str):
        super().__init__(message)
        self.worker = worker


class WorkerDied(WorkerLost):
    """A `die` fault of cluster.faults struck."""

    def __init__(self, worker: int, at_s: float):
        super().__init__(
            worker, f"worker {worker} died at {at_s:.3f} s (a fault injected by cluster.faults)"
        )
        self.at_s = at_s


@stored
class Faults:
    """One worker's scheduled faults, struck when its steps start: those of its step index
    (`at_step`), then those due by the time (`at_s`), in order. Every engine calls `strike`
    once per step the worker starts, and the world adds `slow_s` to each message the worker
    sends in that step (the network model's prices take it). A
    `slow_compute` fault is not struck here: the profile's step times carry it
    (`Profile.step_s`)."""

    def __init__(
        self,
        profile: Profile,
        worker: int,
        after_s: float = 0.0,
        step: int = 0,
        replaced: bool = False,
    ):
        """A resumed run starts at run time `after_s` and the worker's step `step`: the
        faults before struck the earlier run. A spare in a lost worker's place (`replaced`)
        starts there too, and the faults that struck its predecessor then do not strike it
        again."""
        self.worker, self.step = worker, step
        mine = [f for f in profile.faults(worker) if f.action not in STEP_ACTIONS]
        first = step + replaced
        self.by_step = sorted((f for f in mine if f.at_step >= first), key=lambda f: f.at_step)
        due = (lambda f: f.at_s > after_s) if replaced else (lambda f: f.at_s >= after_s)
        self.pending = [f for f in mine if f.at_step < 0 and due(f)]
        self.slowing: list[tuple[float, float]] = []  # (until, seconds) of the slow faults
        self.slow_s = 0.0  # what the slow faults in force add to each message sent

    def strike(self, now: float, pause: Callable[[float, float], None]) -> float:
        """Strike the faults due at this step or by `now` (run seconds); returns when the
        step can start. A pause calls `pause(at, seconds)` and pushes the start back (a
        later fault may then fall due); a death raises `WorkerDied`."""
        step, self.step = self.step, self.step + 1
        while self.by_step and self.by_step[0].at_step <= step:
            now = self._hit(self.by_step.pop(0), now, pause)
        while self.pending and self.pending[0].at_s <= now:
            now = self._hit(self.pending.pop(0), now, pause)
        if self.slowing:
            self.slowing = [(until, s) for until, s in self.slowing if until > now]
            self.slow_s = sum(s for _, s in self.slowing)
        return now

    def _hit(self, fault: FaultConfig, now: float, pause) -> float:
        if fault.action == "die":
            raise WorkerDied(self.worker, now)
        if fault.action == "slow":  # from this step on, for duration_s (0: to the end)
            until = now + fault.duration_s if fault.duration_s else math.inf
            self.slowing.append((until, fault.delay_ms / 1000.0))
            return now
        pause(now, fault.duration_s)
        return now + fault.duration_s


def pad_to(start: float, target_s: float) -> None:
    """Sleep until `target_s` seconds have passed since `start` (perf_counter), if not yet:
    a real step lasts the profile's step time (a profile slows compute, never speeds it)."""
    remaining = target_s - (time.perf_counter() - start)
    if remaining > 0:
        time.sleep(remaining)


# an emulated network wait woke late (the machine did not keep the model's time: its cores
# were taken) when it ended more than both of these past its end: on an idle machine and on
# one running five processes on two cores, a sleep of 0.2-5 ms woke a median 75-97 µs and
# at most 0.41 ms late (200 of each)
LATE_S, LATE_FRACTION = 1e-3, 0.1


class Waits:
    """The emulated network's waits in one process — a message's or a collective's
    modelled time, slept or padded to once its real part is done — and those that woke
    late (more than `LATE_S` and `LATE_FRACTION` of the wait past its end). A wait whose
    end had passed before it began (the real part took longer) is no wait: it says nothing
    of the cores."""

    def __init__(self) -> None:
        self.count = self.late = 0
        self._lock = threading.Lock()  # a hub's uplink thread waits too

    def until(self, end: float, seconds: float) -> None:
        """Sleep until perf_counter's `end`, the end of something the model gives `seconds`."""
        remaining = end - time.perf_counter()
        if remaining <= 0:
            return
        time.sleep(remaining)
        over = time.perf_counter() - end
        with self._lock:
            self.count += 1
            self.late += over > max(LATE_S, LATE_FRACTION * seconds)

    def sleep(self, seconds: float) -> None:
        """A modelled delay of `seconds` from now."""
        if seconds > 0:  # a free network costs no system call
            self.until(time.perf_counter() + seconds, seconds)


class LinkClock:
    """When each collective issued on one process group ends in the emulated network: the
    group carries one at a time, so a collective starts once it is issued and the one
    before it is through."""

    def __init__(self, network: Network):
        self.network, self.free_at = network, 0.0

    def after(self, seconds: float) -> float:
        """A collective lasting `seconds` issued now: when it ends (perf_counter seconds)."""
        start = max(self.free_at, time.perf_counter())
        self.free_at = start + seconds
        return self.free_at

    def issue(self, nbytes: int, slow_s: float = 0.0) -> float:
        """A ring all-reduce of `nbytes` issued now: when it ends."""
        return self.after(self.network.allreduce_s(nbytes, slow_s))


class Shaped(Transport):
    """A worker's transport through the network model: a send waits the push direction's
    delay for its size, a receive the pull direction's once the message is in, an
    all-reduce the ring all-reduce's time (`Network.allreduce_s`); each as slowed by the
    worker's `faults` in force (set it once they are known). `wire_s` adds up the seconds
    its messages and collectives took on the wire, as modelled."""

    def __init__(
        self, inner: Transport, network: Network, faults: Faults | None = None, rank: int = 0
    ):
        self.inner, self.network, self.faults, self.rank = inner, network, faults, rank
        self.clock = LinkClock(network)  # its collectives, one after another
        self.wire_s = 0.0
        self.waits = Waits()  # how well this process kept the model's times

    def mailbox(
        self, src: int, dst: int, size: int, header: int, pinned: bool = False
    ) -> torch.Tensor:
        return self.inner.mailbox(src, dst, size, header, pinned)

    @property
    def slow_s(self) -> float:
        return self.faults.slow_s if self.faults is not None else 0.0

    @property
    def bytes_sent(self) -> int:  # type: ignore[override]
        return self.inner.bytes_sent

    def send(self, buf: torch.Tensor, dst: int) -> None:
        self._depart(buf, dst)
        self.inner.send(buf, dst)

    def isend(self, buf: torch.Tensor, dst: int):
        self._depart(buf, dst)
        return self.inner.isend(buf, dst)

    def _depart(self, buf: torch.Tensor, dst: int) -> None:
        """Held while the message leaves its NIC, then while it crosses the topology's
        shared links (`Network.cross`). A pipelined message's latency is not waited for:
        it is delivered as soon as it is sent, up to that latency early."""
        size, network = _size(buf), self.network.between(self.rank, dst)
        self._pay(network.hold_s(size, self.slow_s))
        wire = network.push_wire_s(size)
        self._pay(network.cross(self.rank, dst, size, time.perf_counter(), wire))

    def _pay(self, seconds: float) -> None:
        self.wire_s += seconds
        self.waits.sleep(seconds)

    def wait(self, work, dst: int) -> None:
        self.inner.wait(work, dst)

    def recv(
        self, buf: torch.Tensor, src: int, timeout: timedelta | None = None, pay: bool = True
    ) -> None:
        """Receive, then the pull delay (`pay`: a message from a hub; a peer's sender paid
        its transfer)."""
        self.inner.recv(buf, src, timeout)
        if pay:
            self._pay(self.network.between(src, self.rank).pull_s(_size(buf)))

    def all_reduce(self, buf: torch.Tensor) -> None:
        self._pay(self.network.allreduce_s(_size(buf), self.slow_s))
        self.inner.all_reduce(buf)

    def all_reduce_start(self, buf: torch.Tensor, seconds: float | None = None) -> Pending:
        """The all-reduce goes on while the caller computes; its wait() returns no sooner
        than `seconds` (default: the network's ring all-reduce time) after it starts: now,
        or when the collectives started before it end (they run one after another)."""
        if seconds is None:
            seconds = self.network.allreduce_s(_size(buf), self.slow_s)
        return self._paced(self.inner.all_reduce_start(buf), seconds)

    def all_gather_start(
        self, out: list[torch.Tensor], buf: torch.Tensor, seconds: float | None = None
    ) -> Pending:
        """As all_reduce_start (default: the network's ring all-gather time)."""
        if seconds is None:
            seconds = self.network.allgather_s(_size(buf), self.slow_s)
        return self._paced(self.inner.all_gather_start(out, buf), seconds)

    def _paced(self, inner: Pending, seconds: float) -> Pending:
        self.wire_s += seconds
        end = self.clock.after(seconds)

        def wait() -> None:
            inner.wait()
            self.waits.until(end, seconds)

        return Pending(wait)

    def barrier(self) -> None:
        self.inner.barrier()


def _size(buf: torch.Tensor) -> int:
    return buf.numel() * buf.element_size()

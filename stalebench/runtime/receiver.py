"""A thread per peer that waits on its messages: gloo completes a posted receive only
through wait(), so a rank that listens to many peers (a server) waits on each in a thread
of its own and reads what arrives from one queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from datetime import timedelta

import torch

from stalebench.runtime.faults import WorkerLost
from stalebench.runtime.transport import Transport


class Receiver(threading.Thread):
    """Receives the messages of worker `worker` from rank `rank`: each one the buffers
    `make(rank)` returns, filled in order, put on `inbox` as (this receiver, buffers) — or
    (this receiver, the exception) when the peer is lost. It posts the next receive only
    once armed (after the server replied), so its timeout measures the worker's silence,
    not the server's."""

    def __init__(
        self,
        transport: Transport,
        worker: int,
        make: Callable[[int], list[torch.Tensor]],
        inbox: queue.Queue,
        rank: int,
    ):
        super().__init__(daemon=True, name=f"recv-worker-{worker}-rank-{rank}")
        self.transport, self.worker, self.make, self.inbox = transport, worker, make, inbox
        self.rank = rank
        self.armed = threading.Event()
        self.armed_at: float | None = None  # server time of the reply it waits to follow
        self.closed = False

    def arm(self, now: float) -> None:
        self.armed_at = now
        self.armed.set()

    def close(self) -> None:
        self.closed = True
        self.armed.set()

    def run(self) -> None:
        while True:
            self.armed.wait()
            self.armed.clear()
            if self.closed:
                return
            bufs = self.make(self.rank)
            try:  # the server judges silence itself (it knows whom it waits for): no
                # gloo timeout here, which would also break the other workers' receives
                for buf in bufs:
                    self.transport.recv(buf, self.rank, timedelta(days=1))
            except Exception as exc:  # a dead or silent peer: the server ends the run
                self.inbox.put((self, exc))
                return
            self.inbox.put((self, bufs))


class Inbox:
    """A server's listening end: a Receiver per worker, and the next message from any of
    them, with the server's judgement of silence (a worker it awaits a reply from that
    stays silent longer than `timeout_s`) and of the wall budget."""

    def __init__(
        self,
        transport: Transport,
        peers: dict[int, int],
        make: Callable[[int], list[torch.Tensor]],
        now: Callable[[], float],
        timeout_s: float,
    ):
        """`peers`: each worker's index → its rank."""
        self.queue: queue.Queue = queue.Queue()
        self.transport, self.make = transport, make
        self.receivers = {w: Receiver(transport, w, make, self.queue, r) for w, r in peers.items()}
        self.now, self.timeout_s = now, timeout_s

    def start(self) -> None:
        for r in self.receivers.values():
            r.start()

    def replace(self, worker: int, rank: int) -> None:
        """Worker `worker` is now rank `rank` (a spare in a lost worker's place): what its
        closed receiver may still get from the old rank is dropped."""
        self.receivers[worker].close()
        self.receivers[worker] = Receiver(self.transport, worker, self.make, self.queue, rank)
        self.receivers[worker].start()

    def next(self, active: set[int], max_wall_s: float):
        """The next (worker, buffers) from a worker in `active`; None when the wall budget
        ran out first; a RunError naming the worker when one stays silent too long."""
        timeout = self.timeout_s
        while True:
            awaited = [
                r for r in self.receivers.values() if r.worker in active and r.armed_at is not None
            ]
            first = min(awaited, key=lambda r: r.armed_at, default=None)
            now = self.now()
            wait = first.armed_at + timeout - now if first else timeout
            if max_wall_s:
                wait = min(wait, max_wall_s - now)
            try:
                receiver, item = self.queue.get(timeout=max(wait, 0.0) + 1e-3)
            except queue.Empty:
                now = self.now()
                if max_wall_s and now >= max_wall_s:
                    return None
                if first and now - first.armed_at >= timeout:
                    raise WorkerLost(
                        first.worker,
                        f"worker {first.worker} (rank {first.rank}) silent for "
                        f"{now - first.armed_at:.1f} s, more than timeout_s={timeout:g}",
                    ) from None
                continue
            w = receiver.worker
            if self.receivers[w] is not receiver:
                continue  # from the rank a spare replaced
            receiver.armed_at = None
            if isinstance(item, Exception):
                if w not in active:
                    continue  # it had been told to stop: its exit is not a failure
                raise WorkerLost(w, str(item)) from item
            return w, item

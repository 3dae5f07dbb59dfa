"""How processes of a real run exchange tensors: the `Transport` interface every engine
talks to, its gloo implementation over the default process group, and same-host mailboxes
in shared memory over it.

Every receive has a timeout; after one, a gloo group is unusable, so a lost peer ends the
run (the error names the peer as the engine names its ranks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stalebench import placement
from stalebench.errors import RunError


class Transport:
    """Point-to-point messages and the all-reduce, between the ranks of one run."""

    bytes_sent: int

    def mailbox(
        self, src: int, dst: int, size: int, header: int, pinned: bool = False
    ) -> torch.Tensor:
        """A float32 buffer of `size` for the messages rank `src` sends rank `dst` (this
        rank is one of them), each `header` values then a payload. Sending or receiving
        this very buffer may skip copies: in shared memory only the header travels, so the
        sender writes the next message only once the receiver is done with this one (a
        reply says so), and the receiver reads the payload in place. `pinned`: in page-
        locked memory, for a rank on a GPU (its copies to and from the device are then
        asynchronous: `placement.host_buffer`)."""
        return placement.host_buffer(size, pinned)

    def send(self, buf: torch.Tensor, dst: int) -> None:
        raise NotImplementedError

    def isend(self, buf: torch.Tensor, dst: int) -> Any:
        """Start a send; the caller keeps `buf` alive until `wait(work, dst)`."""
        raise NotImplementedError

    def wait(self, work: Any, dst: int) -> None:
        raise NotImplementedError

    def recv(self, buf: torch.Tensor, src: int, timeout: timedelta | None = None) -> None:
        raise NotImplementedError

    def all_reduce(self, buf: torch.Tensor) -> None:
        """Sum `buf` over every rank, in place."""
        raise NotImplementedError

    def all_reduce_start(self, buf: torch.Tensor) -> Pending:
        """Start summing `buf` over every rank; it holds the sum once the returned handle's
        `wait()` returns. Every rank starts its all-reduces in the same order."""
        raise NotImplementedError

    def all_gather_start(self, out: list[torch.Tensor], buf: torch.Tensor) -> Pending:
        """Start gathering every rank's `buf` into `out` (rank order), as all_reduce_start."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def regroup(self, group: Any, members: list[int]) -> None:
        """Collectives and messages from now on over `group`, a gloo group of the ranks
        left, `members` (a wrapper passes it on)."""
        self.inner.regroup(group, members)  # type: ignore[attr-defined]

    def watch(self, check: Callable[[], None]) -> None:
        """While a collective is under way, call `check` every few milliseconds: it raises
        to abandon the collective (the other ranks regroup without a lost one)."""
        self.inner.watch(check)  # type: ignore[attr-defined]


class Pending:
    """An all-reduce under way: `wait()` returns once its buffer holds the sum."""

    def __init__(self, wait: Callable[[], None]):
        self.wait = wait


class Gloo(Transport):
    """The default process group (gloo, CPU tensors); `name(rank)` says who a rank is."""

    def __init__(self, timeout_s: float, name: Callable[[int], str]):
        self.timeout = timedelta(seconds=timeout_s)
        self.name = name
        self.bytes_sent = 0
        self.group: Any = None  # the group of the ranks left, once they regrouped (`regroup`)
        self.index: dict[int, int] = {}  # a rank's index in it
        self.retired: list[Any] = []  # the groups before it
        self.check: Callable[[], None] | None = None  # `watch`

    def regroup(self, group: Any, members: list[int]) -> None:
        # messages too: the default group's connections may be broken by the lost rank. The
        # group left is kept: dropped, it would wait out its sends to a lost rank first
        self.retired.append(self.group)
        self.group, self.index = group, {r: i for i, r in enumerate(members)}

    def _p2p(self, buf: torch.Tensor, peer: int, send: bool) -> Any:
        """A send (or receive) of `buf` to (from) `peer`, over the current group."""
        if self.group is None:
            return dist.isend(buf, peer) if send else dist.irecv(buf, peer)
        if peer not in self.index:
            raise RunError(f"{self.name(peer)} is not among the ranks left")
        return (self.group.send if send else self.group.recv)([buf], self.index[peer], 0)

    def watch(self, check: Callable[[], None]) -> None:
        self.check = check

    def _wait(self, work: Any) -> None:
        """Wait for a collective: at most timeout_s, polling `check` (`watch`) if set."""
        if self.check is None:
            work.wait(self.timeout)
            return
        deadline, polls = time.monotonic() + self.timeout.total_seconds(), 0
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise RunError(f"timed out after {self.timeout.total_seconds():g} s")
            polls += 1
            if polls % 50 == 0:  # every ~10 ms
                self.check()
            time.sleep(0.0002)
        work.wait(self.timeout)  # its error, if it failed

    def lost(self, rank: int, exc: Exception) -> RunError:
        return RunError(f"{self.name(rank)} lost: {brief(exc)}")

    def send(self, buf: torch.Tensor, dst: int) -> None:
        try:
            self._p2p(buf, dst, send=True).wait(self.timeout)
        except Exception as exc:
            raise self.lost(dst, exc) from exc
        self.bytes_sent += buf.numel() * buf.element_size()

    def isend(self, buf: torch.Tensor, dst: int):
        try:
            work = self._p2p(buf, dst, send=True)
        except Exception as exc:
            raise self.lost(dst, exc) from exc
        self.bytes_sent += buf.numel() * buf.element_size()
        return work

    def wait(self, work, dst: int) -> None:
        try:
            work.wait(self.timeout)
        except Exception as exc:
            raise self.lost(dst, exc) from exc

    def recv(self, buf: torch.Tensor, src: int, timeout: timedelta | None = None) -> None:
        try:
            self._p2p(buf, src, send=False).wait(timeout or self.timeout)
        except Exception as exc:
            raise self.lost(src, exc) from exc

    def collective_failed(self, what: str, exc: Exception) -> RunError:
        """A collective names no peer: say what may have happened to one."""
        return RunError(
            f"{what} failed (a peer died, or was silent for more than timeout_s="
            f"{self.timeout.total_seconds():g}): {brief(exc)}"
        )

    def all_reduce(self, buf: torch.Tensor) -> None:
        self.all_reduce_start(buf).wait()

    def all_reduce_start(self, buf: torch.Tensor) -> Pending:
        if self.group is None:
            work = dist.all_reduce(buf, async_op=True)
        else:
            work = self.group.allreduce([buf])

        def wait() -> None:
            try:
                self._wait(work)
            except Exception as exc:
                raise self.collective_failed("an all-reduce", exc) from exc

        return Pending(wait)

    def all_gather_start(self, out: list[torch.Tensor], buf: torch.Tensor) -> Pending:
        if self.group is None:
            work = dist.all_gather(out, buf, async_op=True)
        else:
            work = self.group.allgather([out], [buf])

        def wait() -> None:
            try:
                self._wait(work)
            except Exception as exc:
                raise self.collective_failed("an all-gather", exc) from exc

        return Pending(wait)

    def barrier(self) -> None:
        dist.barrier()


class SharedMemory(Transport):
    """Ranks on one machine: mailboxes are files in a shared-memory directory that both
    ranks map; a message in one sends only its header through `inner` (gloo, whose
    send/receive order makes the payload written before it visible). Everything else goes
    through `inner`. `bytes_sent` counts whole messages, as over gloo."""

    def __init__(self, inner: Transport, directory: Path):
        self.inner, self.dir = inner, directory
        self.headers: dict[tuple[int, int], int] = {}  # a mailbox's (address, size): header
        self.paths: dict[tuple[int, int], Path] = {}  # its file, until both ranks map it
        self.in_place = 0  # payload bytes the mailboxes carried

    @property
    def bytes_sent(self) -> int:  # type: ignore[override]
        return self.inner.bytes_sent + self.in_place

    def mailbox(
        self, src: int, dst: int, size: int, header: int, pinned: bool = False
    ) -> torch.Tensor:
        # a file's pages, shared by the two processes: not pinned (that would copy them)
        path = self.dir / f"{src}-{dst}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 4 * size)  # both ranks: the same size, content kept
        finally:
            os.close(fd)
        box = torch.from_file(str(path), shared=True, size=size, dtype=torch.float32)
        self.headers[(box.data_ptr(), size)] = header
        self.paths[(box.data_ptr(), size)] = path
        return box

    def _wire(self, buf: torch.Tensor) -> torch.Tensor:
        """What of `buf` crosses gloo: a mailbox's header, or all of any other buffer."""
        header = self.headers.get((buf.data_ptr(), buf.numel()))
        return buf if header is None else buf[:header]

    def send(self, buf: torch.Tensor, dst: int) -> None:
        wire = self._wire(buf)
        self.inner.send(wire, dst)
        self.in_place += (buf.numel() - wire.numel()) * buf.element_size()

    def isend(self, buf: torch.Tensor, dst: int):
        wire = self._wire(buf)
        work = self.inner.isend(wire, dst)
        self.in_place += (buf.numel() - wire.numel()) * buf.element_size()
        return work

    def recv(self, buf: torch.Tensor, src: int, timeout: timedelta | None = None) -> None:
        self.inner.recv(self._wire(buf), src, timeout)
        path = self.paths.pop((buf.data_ptr(), buf.numel()), None)
        if path is not None:  # both ranks have it mapped now: nothing is left if killed
            path.unlink(missing_ok=True)

    def wait(self, work, dst: int) -> None:
        self.inner.wait(work, dst)

    def all_reduce(self, buf: torch.Tensor) -> None:
        self.inner.all_reduce(buf)

    def all_reduce_start(self, buf: torch.Tensor) -> Pending:
        return self.inner.all_reduce_start(buf)

    def all_gather_start(self, out: list[torch.Tensor], buf: torch.Tensor) -> Pending:
        return self.inner.all_gather_start(out, buf)

    def barrier(self) -> None:
        self.inner.barrier()


def brief(exc: Exception) -> str:
    """gloo's message without its source location and advice: '[file:line] What. Advice.'"""
    text = str(exc).split("] ", 1)[-1]
    return text.split(". ", 1)[0].strip()

"""How processes of a real run exchange tensors: the `Transport` interface every engine
talks to, and its gloo implementation over the default process group.

Every receive has a timeout; after one, a gloo group is unusable, so a lost peer ends the
run (the error names the peer as the engine names its ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stalebench.errors import RunError


class Transport:
    """Point-to-point messages and the all-reduce, between the ranks of one run."""

    bytes_sent: int

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

    def lost(self, rank: int, exc: Exception) -> RunError:
        return RunError(f"{self.name(rank)} lost: {brief(exc)}")

    def send(self, buf: torch.Tensor, dst: int) -> None:
        try:
            dist.send(buf, dst)
        except Exception as exc:
            raise self.lost(dst, exc) from exc
        self.bytes_sent += buf.numel() * buf.element_size()

    def isend(self, buf: torch.Tensor, dst: int):
        try:
            work = dist.isend(buf, dst)
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
            dist.irecv(buf, src).wait(timeout or self.timeout)
        except Exception as exc:
            raise self.lost(src, exc) from exc

    def collective_failed(self, what: str, exc: Exception) -> RunError:
        """A collective names no peer: say what may have happened to one."""
        return RunError(
            f"{what} failed (a peer died, or was silent for more than timeout_s="
            f"{self.timeout.total_seconds():g}): {brief(exc)}"
        )

    def all_reduce(self, buf: torch.Tensor) -> None:
        try:
            dist.all_reduce(buf)
        except Exception as exc:
            raise self.collective_failed("an all-reduce", exc) from exc

    def all_reduce_start(self, buf: torch.Tensor) -> Pending:
        work = dist.all_reduce(buf, async_op=True)

        def wait() -> None:
            try:
                work.wait(self.timeout)
            except Exception as exc:
                raise self.collective_failed("an all-reduce", exc) from exc

        return Pending(wait)

    def all_gather_start(self, out: list[torch.Tensor], buf: torch.Tensor) -> Pending:
        work = dist.all_gather(out, buf, async_op=True)

        def wait() -> None:
            try:
                work.wait(self.timeout)
            except Exception as exc:
                raise self.collective_failed("an all-gather", exc) from exc

        return Pending(wait)

    def barrier(self) -> None:
        dist.barrier()


def brief(exc: Exception) -> str:
    """gloo's message without its source location and advice: '[file:line] What. Advice.'"""
    text = str(exc).split("] ", 1)[-1]
    return text.split(". ", 1)[0].strip()

"""The process the real runtime's ranks are forked from: it imports torch and the runtime
once, so starting a run's ranks costs a fork each, not an interpreter importing torch on
every core. It is started as soon as a real run is known to come (its imports then overlap
the parent's validation), kept for later runs of the same process (a sweep's), and ends
with that process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Sequence
from multiprocessing import forkserver

# what every rank imports, once, in the fork server (the caller adds its engine's module)
PRELOAD = ["torch", "torch.distributed", "stalebench.runtime.launch"]


def context(preload: Sequence[str] = ()):
    """The multiprocessing context that forks ranks from the server (started if need be,
    importing PRELOAD and `preload` first)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *preload])
    return ctx


def detach() -> None:
    """In a rank: let go of the server's liveness pipe, which every forked process inherits,
    so that the server ends when the process that started it does (then the rank too: its
    parent is the server, and it dies with its parent)."""
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        forkserver._forkserver._forkserver_alive_fd = None


def start(preload: Sequence[str] = ()) -> None:
    """Start the server now, without waiting for its imports."""
    context(preload)
    forkserver.ensure_running()


def stop() -> None:
    """Let the server end now, in a process that starts no more runs (an interrupted one):
    else it ends only once this process has, its interpreter's teardown (torch imported: a
    second or more on a busy machine) after this one's instead of beside it."""
    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)  # it ends when this pipe closes
        server._forkserver_alive_fd = server._forkserver_pid = None
        server._forkserver_address = None  # (an abstract socket on Linux: no file)

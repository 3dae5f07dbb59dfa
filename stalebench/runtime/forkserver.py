"""The process the real runtime's ranks are forked from: it imports torch and the runtime
once, so starting a run's ranks costs a fork each, not an interpreter importing torch on
every core. It is started as soon as a real run is known to come (its imports then overlap
the parent's validation), kept for later runs of the same process (a sweep's), and ends
with that process. A later run that imports a module the running server did not (another
engine's, an optimizer's torch._dynamo: ~2 s of CPU in every rank, every run) replaces it
with one that imports what both do.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Sequence
from multiprocessing import forkserver

# what every rank imports, once, in the fork server (the caller adds its engine's module);
# pandas and its parquet writer: the rank that writes the run directory imports them
# before its start (`summary.load_writers`), a second on a busy machine that every other
# rank would wait for at the start
PRELOAD = ["torch", "torch.distributed", "stalebench.runtime.launch", "pandas", "pyarrow.parquet"]
_serving: list[str] | None = None  # what the running server imported (set by `context`)
_retired: list[int] = []  # servers replaced, reaped once they have ended


def context(preload: Sequence[str] = ()):
    """The multiprocessing context that forks ranks from the server (started if need be,
    importing PRELOAD, what the server before it imported, and `preload` first)."""
    global _serving
    ctx = multiprocessing.get_context("forkserver")
    wanted = list(dict.fromkeys([*PRELOAD, *(_serving or ()), *preload]))
    if not _running():
        _serving = wanted  # what the server started next imports
    ctx.set_forkserver_preload(wanted)
    return ctx


def _running() -> bool:
    return forkserver._forkserver._forkserver_pid is not None


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
    """Start the server now, without waiting for its imports; one already running that did
    not import all of `preload` is let go, and one that imports what both do started."""
    served = _serving
    if _running():
        if served is not None and set(preload) <= set(served):
            return
        _retired.append(forkserver._forkserver._forkserver_pid)
        stop()
    for pid in list(_retired):  # the zombies of servers replaced before
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0:
                continue  # still ending
        _retired.remove(pid)
    context([*(served or ()), *preload])
    forkserver.ensure_running()


def stop() -> None:
    """Let the server end now, in a process that starts no more runs (an interrupted one):
    else it ends only once this process has, its interpreter's teardown (torch imported: a
    second or more on a busy machine) after this one's instead of beside it."""
    global _serving
    server, _serving = forkserver._forkserver, None
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)  # it ends when this pipe closes
        server._forkserver_alive_fd = server._forkserver_pid = None
        server._forkserver_address = None  # (an abstract socket on Linux: no file)

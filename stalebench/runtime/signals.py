"""SIGINT and SIGTERM to a run's top process: the run stops, not the Python interpreter.

Inside `interruptible()` either signal raises `Interrupted` in the main thread, once: the
caller stops its ranks, writes summary.json with status `interrupted` and re-raises, and
further signals are ignored while it winds down (a bounded few seconds). The CLI turns
`Interrupted` into one line and the exit code 128 + the signal's number.

In a SLURM job's task (Hydra's submitit launcher), SLURM's warning of a time limit or a
preemption, SIGUSR2, interrupts the run too (`interruptible(requeue=True)`); the CLI then
hands it to submitit's own handler, which requeues the job (`requeue`), and the requeued
job resumes the run from its last checkpoint.

A process that runs a multirun's jobs for a launcher (a loky worker of Hydra's joblib
launcher) keeps either signal for later outside a run instead of dying of it (`defer`):
its next run is interrupted as it starts, and it starts no job after.

A rank ignores SIGINT (a Ctrl-C reaches the whole foreground process group; the top
process decides) and dies with its parent (`die_with_parent`) and with the process that
supervises it, so even a SIGKILL of the top process leaves no rank behind, and no rank
writes to the run directory once its supervisor is gone. One exception: a torchrun rank
other than rank 0 that is writing the summary of a run whose rank 0 is lost finishes it
first (`outliving_parent`), its agent gone or not: when rank 0's node hosts the store, the
other agents fail at once and end their ranks.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
REQUEUE = signal.SIGUSR2  # SLURM's (and submitit's local executor's) time limit, preemption
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

_deferring = False  # this process runs jobs for a launcher (`defer`)
_deferred: int | None = None  # the first signal it received, if any
_shields = 0  # `shielded` blocks the main thread is in
_held: int | None = None  # a signal that came inside one, raised at its end
_outliving = 0  # `outliving_parent` blocks under way (any thread)
_outlived = threading.Condition()
_requeue_handler: object = None  # what handled REQUEUE before the run's (submitit's)
GRACE_S = 2.0  # how long a rank that may outlive its parent lives on to start doing so


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached the run's top process (a BaseException, like
    KeyboardInterrupt: no `except Exception` may swallow it)."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for a signal's death


@contextlib.contextmanager
def interruptible(requeue: bool = False) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise `Interrupted` (outside the main thread,
    where Python cannot catch signals, nothing changes); with `requeue`, SIGUSR2 too (a
    SLURM job's task: `requeue` hands it on)."""
    global _requeue_handler
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (*SIGNALS, REQUEUE) if requeue else SIGNALS

    def handler(signum, _frame) -> None:
        global _held
        for s in signals:  # one interruption: the wind-down is not interrupted again
            signal.signal(s, signal.SIG_IGN)
        if _deferring:
            _keep(signum)  # a launcher's worker: no job after this one
        if _shields:
            _held = signum  # raised where the shielded block ends
            return
        raise Interrupted(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    if requeue:
        _requeue_handler = previous[REQUEUE]
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def requeue(signum: int) -> None:
    """After a run interrupted by SIGUSR2 in a SLURM job's task: the signal to the handler
    that had it before the run (submitit's, which on the job's first task requeues the job
    and exits; elsewhere returns)."""
    if callable(_requeue_handler):
        _requeue_handler(signum, None)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A block no signal may break midway: inside `interruptible()`, SIGINT or SIGTERM that
    comes inside is held and raised as `Interrupted` once the block is done. torch.func's
    transforms keep a stack of layers in C++ that an exception raised by a signal handler
    between its Python frames can leave unbalanced: the run then failed with functorch's
    internal assert (`!dynamicLayerStack.empty()`) instead of ending interrupted."""
    global _shields, _held
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _shields += 1
    try:
        yield
    finally:
        _shields -= 1
        if not _shields and _held is not None:  # the signal is what ended the block
            signum, _held = _held, None
            raise Interrupted(signum)  # noqa: B012 (it replaces an exception the block raised)


def defer() -> None:
    """In a process that runs a multirun's jobs for a launcher, from its start (loky's
    initializer): SIGINT and SIGTERM no longer end it. Inside a run's `interruptible()`
    they interrupt the run as anywhere; outside, the first is kept (`deferred`): the run
    that starts next is interrupted at once (`interrupt_if_deferred`), and the CLI starts
    no job after. A worker dead of a signal would make its launcher kill the other workers
    on the spot, before their runs could record themselves interrupted."""
    global _deferring
    _deferring = True
    for s in SIGNALS:
        signal.signal(s, _keep)


def _keep(signum: int, _frame=None) -> None:
    global _deferred
    if _deferred is None:
        _deferred = signum


def deferred() -> int | None:
    """The signal a launcher's worker received (`defer`), or None."""
    return _deferred


def interrupt_if_deferred() -> None:
    """Inside `interruptible()`: a signal that came before, kept by `defer`, interrupts
    now."""
    if _deferred is not None:
        raise Interrupted(_deferred)


def die_with_parent(
    parent_pid: int,
    ignore_sigint: bool = True,
    supervisor: int | None = None,
    may_outlive: bool = False,
) -> None:
    """In a rank: ignore SIGINT (the top process decides), and be killed when the process
    that started it dies (Linux; elsewhere only the SIGINT part), and, given `supervisor`,
    as soon as that process dies too (`_die_with`). `may_outlive`: the parent's death is
    watched by a thread, which lets an `outliving_parent` block under way or begun within
    GRACE_S finish first (Linux >= 5.3; elsewhere the parent-death signal, at once)."""
    if ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not (may_outlive and _die_with(parent_pid, outlive=True)):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    if supervisor is not None:
        _die_with(supervisor)


@contextlib.contextmanager
def outliving_parent() -> Iterator[None]:
    """While inside, a rank that may outlive its parent (`die_with_parent`) lives on when
    the parent dies, and (in the main thread) ignores SIGTERM, by which the parent, failing,
    stops its children (torchrun's agent, which SIGKILLs them 30 s later); it dies once the
    block ends (at the latest GRACE_S after the parent's death)."""
    global _outliving
    with _outlived:
        _outliving += 1
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        with _outlived:
            _outliving -= 1
            _outlived.notify_all()


def _outlive() -> None:
    """The parent died: wait while an `outliving_parent` block is under way, or may begin
    within GRACE_S."""
    end = time.monotonic() + GRACE_S
    with _outlived:
        while _outliving or time.monotonic() < end:
            _outlived.wait(None if _outliving else max(end - time.monotonic(), 0.0))


def _die_with(pid: int, outlive: bool = False) -> bool:
    """SIGKILL this process the moment process `pid` ends (`outlive`: once `_outlive` lets
    it): a thread blocked on its pidfd (Linux >= 5.3; elsewhere nothing: False), costing
    the training loop nothing.

    A rank's parent is the fork server, not its supervisor: the server ends only once it
    sees its liveness pipe close and its interpreter (torch imported) is torn down, 0.6 s
    on an idle machine and seconds on a busy one, and the parent-death signal comes only
    then; meanwhile the ranks would go on training and writing to the run directory, which
    a scheduler restarting the run with resume=true may already be reading."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):  # no pidfds here: the parent-death signal alone
        return False

    def wait() -> None:
        poll = select.poll()
        poll.register(fd, select.POLLIN)  # readable once the process has ended
        poll.poll()
        if outlive:
            _outlive()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="stalebench-supervisor-watch", daemon=True).start()
    return True

"""The real runtime's processes: start every rank of a run (spawned on this machine, or
by `torchrun`), form the gloo process group, hand each rank to its engine, supervise, and
make sure summary.json exists and no process outlives the run.

The runtime knows an engine only through its hooks (`world_size`, `rank_name`,
`num_workers`, `one_stream`, `program`); rank 0 owns the run directory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stalebench.config import RunConfig
from stalebench.errors import last_line, with_traceback
from stalebench.job import Job, config_sha, meta
from stalebench.metrics.events import cut_after_end
from stalebench.metrics.summary import finalize, stop, write_json, write_text
from stalebench.runtime import checkpoint, forkserver, nodes
from stalebench.runtime.faults import FAULT_EXIT, WorkerDied
from stalebench.runtime.quorum import mark_dead
from stalebench.runtime.real import OVERRUN_KEY, RealWorld, run_program
from stalebench.runtime.record import RunRecord
from stalebench.runtime.signals import die_with_parent, outliving_parent
from stalebench.runtime.transport import Gloo, SharedMemory, Transport

log = logging.getLogger("stalebench")

SHM = "/dev/shm"  # where same-host mailboxes live (Linux); elsewhere messages go over gloo
# the fraction of a run's profiled steps that may run longer than drawn, or of its network
# waits that may wake late, before the run says it was not the cluster asked for (its result
# line; summary.json's `overrun`)
OVERRUN_LIMIT = 0.05


def run_rank(
    cfg: RunConfig,
    engine,
    rank: int,
    world_size: int,
    store: dist.Store | None,
    shared: Path | None = None,
) -> int:
    """One process's part in a run; returns its exit code. With `store` None the process
    group forms from torchrun's environment, each process taking the rank it plays
    (`nodes.form_group`); rank 0 then tells the others the run dir. `shared`: a
    shared-memory directory for same-host mailboxes (every rank on this machine). The
    world is the engine's: the spawn launcher starts that many, and a torchrun or SLURM
    launch of another size is refused before (`nodes.check_size`)."""
    torch.set_num_threads(cfg.num_threads)
    timeout = timedelta(seconds=cfg.timeout_s)
    node_store = None
    if store is None:  # torchrun: Hydra made a directory per rank; rank 0's is the run's
        # its node's agent: a lost node (a rank > 0 may finish writing the summary of a
        # run whose rank 0 is lost first: `_summary_if_rank_0_is_gone`)
        die_with_parent(os.getppid(), ignore_sigint=False, may_outlive=not nodes.owns_run_dir())
        rank, node_store = nodes.form_group(timeout)
        if rank == 0:
            nodes.beat(timeout)
        run_dir_of_rank_0 = [cfg.run_dir]
        dist.broadcast_object_list(run_dir_of_rank_0, src=0)
        cfg.run_dir = run_dir_of_rank_0[0]
    else:
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    run_dir = Path(cfg.run_dir)
    logs = nodes.log_dir(run_dir, rank)  # torchrun: off rank 0's node, a directory of its own
    _setup_logging(logs, rank, "INFO")
    given = f" (torchrun rank {os.environ['RANK']})" if node_store is not None else ""
    log.info("rank %d of %d (pid %d): process group ready%s", rank, world_size, os.getpid(), given)
    transport: Transport = Gloo(cfg.timeout_s, engine.rank_name)
    if shared is not None:
        transport = SharedMemory(transport, shared)
    summary = None
    try:
        job = Job.build(cfg, engine.num_workers, engine.one_stream)
        engine.load_programs()  # the classes its checkpoint may hold
        resume = checkpoint.load(run_dir, config_sha(cfg)) if cfg.resume and rank == 0 else None
        record = RunRecord(job, run_dir, resume=resume) if rank == 0 else None
        world = RealWorld(
            rank, world_size, transport, job.profile, record, run_dir, cfg.timeout_s,
            store if store is not None else dist.distributed_c10d._get_default_store(),
            spares=cfg.cluster.spares if engine.takes_quorum else 0,
            every_s=checkpoint.every_s(cfg), links_dir=shared,
            device=job.device(rank, engine.serves(rank)),
        )  # fmt: skip
        try:
            summary = run_program(engine.program(job, world))
        finally:
            world.close()
            if node_store is not None:  # torchrun: its counts are in the store (`tell_overrun`)
                if logs != run_dir / "logs":  # for rank 0 to gather
                    nodes.send_log(node_store, logs / f"rank-{rank}.log", rank)
                with contextlib.suppress(Exception):
                    node_store.set(f"closed/{rank}", "1")
        status = f": {summary['status']}" if summary else ""
        log.info("%s done%s", engine.rank_name(rank), status)
        if summary and node_store is not None:
            summary = _records_of_every_rank(cfg, summary, node_store, world, run_dir)
            node_store.set("summary", "written")  # for the other nodes: rank 0 ended the run
    except WorkerDied as exc:
        log.warning("%s: %s", engine.rank_name(rank), exc)
        return FAULT_EXIT
    except Exception as exc:
        log.error("%s: %s", engine.rank_name(rank), exc, exc_info=with_traceback(exc))
        with contextlib.suppress(OSError):  # for the supervisor: the error summary.json names
            write_text(_error_file(logs, rank), last_line(exc), run_dir)  # (room held)
        if node_store is not None and rank > 0:
            _summary_if_rank_0_is_gone(cfg, engine, node_store, str(exc))
        return 1
    if summary and summary["status"] != "completed":
        return 0  # a failed run is reported in summary.json; peers may be gone, skip teardown
    dist.destroy_process_group()
    return 0


def _records_of_every_rank(cfg: RunConfig, summary, node_store, world, run_dir: Path):
    """torchrun, rank 0, once every rank has closed (a completed run: at most timeout_s;
    else those closed already: a lost rank tells nothing more): the logs the ranks off this
    node sent, into `logs/`, and summary.json's `overrun`, `hub` and `cycle` from every
    rank's counts (`add_overrun`)."""
    if summary["status"] == "completed":
        closed = [f"closed/{r}" for r in range(world.size)]
        with contextlib.suppress(Exception):  # a rank that never closes: the others' counts
            node_store.wait(closed, timedelta(seconds=cfg.timeout_s))
    for r in range(1, world.size):  # the logs of the ranks off this node, as they sent them
        text, path = nodes.gathered_log(node_store, r), run_dir / "logs" / f"rank-{r}.log"
        if text is not None and not path.exists():
            with contextlib.suppress(OSError):
                path.write_bytes(text)
    return add_overrun(summary, world.store, world.size, run_dir)


def _error_file(logs: Path, rank: int) -> Path:
    return logs / f"rank-{rank}.error"


def _why(run_dir: Path, rank: int) -> str:
    """What a rank that exited with an error said of it (`last_line`), or nothing."""
    try:
        return ": " + _error_file(run_dir / "logs", rank).read_text()
    except OSError:
        return ""


def _summary_if_rank_0_is_gone(cfg: RunConfig, engine, shared: dist.Store, error: str) -> None:
    """torchrun, a rank that failed: unless rank 0 lives (`nodes.rank_0_alive`) and says
    within timeout_s that it wrote summary.json, one failed rank of this node writes one
    into the run dir (on this node's disk), status failed, naming the ranks rank 0's node
    held. Every failed rank waits (torchrun stops a node's ranks when its first one exits);
    a lock file picks the writer. Its agent's death does not stop it (when rank 0's node
    hosted torchrun's store, the agent fails at once)."""
    with outliving_parent():
        _write_summary_if_rank_0_is_gone(cfg, engine, shared, error)


def _write_summary_if_rank_0_is_gone(cfg: RunConfig, engine, shared, error: str) -> None:
    if nodes.rank_0_alive(shared):
        try:
            shared.wait(["summary"], timedelta(seconds=cfg.timeout_s))
            return
        except Exception:
            pass
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / ".summary.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL))
    except FileExistsError:  # another rank writes it: this one exits once it has, for
        # torchrun stops the node's other ranks, the writer among them, when one exits
        deadline = time.monotonic() + cfg.timeout_s
        while lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return
    if not (run_dir / "summary.json").exists():
        with_it = ", ".join(engine.rank_name(r) for r in nodes.same_node(0)[1:])
        lost = f"its node lost?{f' with {with_it}' if with_it else ''}"
        reason = f"{engine.rank_name(0)} ended without a summary ({lost}); here: {error}"
        log.error("writing summary.json: %s", reason)
        stop(run_dir, meta(cfg, engine.num_workers), "failed", reason, cfg.budget.target_accuracy)
    lock.unlink()


def _setup_logging(logs: Path, rank: int, level: str) -> None:
    logging.raiseExceptions = False  # a full disk: no traceback per log line (summary says)
    logs.mkdir(parents=True, exist_ok=True)
    for old in [h for h in log.handlers if getattr(h, "rank_log", False)]:
        log.removeHandler(old)  # an earlier job's of this process (a sweep under torchrun)
        old.close()
    handler = logging.FileHandler(logs / f"rank-{rank}.log")
    handler.rank_log = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)


def _child(
    setup: Callable[[], None],
    cfg: RunConfig,
    engine,
    rank: int,
    world: int,
    port: int,
    parent: int,
    env: dict[str, str],
    shared: Path | None,
) -> None:
    # the top process decides on SIGINT; the supervisor's death is the rank's (at once, and
    # through the fork server, the rank's parent, which ends with it)
    forkserver.detach()
    die_with_parent(os.getppid() if _alive(parent) else -1, supervisor=parent)
    os.environ.clear()
    os.environ.update(env)
    setup()  # what the parent loaded before it (plugins): registries as the parent saw them
    if ipaddress.ip_address(cfg.listen_host).is_loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on loopback too
    timeout = timedelta(seconds=cfg.timeout_s)
    store = dist.TCPStore(cfg.listen_host, port, is_master=False, timeout=timeout)
    code = run_rank(cfg, engine, rank, world, store, shared)
    logging.shutdown()
    os._exit(code)  # no interpreter teardown: gloo threads must not delay or hang the exit


def launch(cfg: RunConfig, engine, setup: Callable[[], None]) -> dict[str, Any]:
    """Start every rank as a spawned process on this machine, supervise them, and make sure
    summary.json exists and no process outlives the run. `setup` runs first in each child
    (a picklable function, e.g. the plugin loader)."""
    import torch.multiprocessing as mp

    run_dir = Path(cfg.run_dir)
    world = engine.world_size()
    store = _store(cfg)
    if mp.get_start_method(allow_none=True) not in (None, "fork", "spawn", "forkserver"):
        # e.g. loky, in a job of Hydra's joblib launcher: the fork server would be told to
        # use a start method it cannot resolve
        mp.set_start_method("spawn", force=True)
    ctx = forkserver.context()
    env = dict(os.environ)  # as the parent sees it now, not as when the server started
    shared = _shared_memory()
    procs = [
        ctx.Process(
            target=_child,
            args=(setup, cfg, engine, r, world, store.port, os.getpid(), env, shared),
            daemon=True,
            name=f"stalebench-rank-{r}",
        )
        for r in range(world)
    ]
    status, error = None, None
    try:  # an exception (an interrupt) still ends every rank before it goes on
        for p in procs:
            p.start()
        status, error = _supervise(cfg, engine, procs, store)
    finally:
        _stop(procs)
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
        if status is not None:
            stop(run_dir, meta(cfg, engine.num_workers), status, error, cfg.budget.target_accuracy)
        # every rank is down: what one wrote after the run's end is not the run's
        cut_after_end(run_dir / "events.jsonl")
    return add_overrun(read_summary(cfg, engine, error), store, world, run_dir)


def add_overrun(summary: dict[str, Any], store: dist.Store, world: int, run_dir: Path):
    """summary.json's `overrun`: the steps the profile timed, on every rank, and how many of
    them ran longer than drawn; the network's emulated waits (a message's or collective's
    modelled time, slept), and how many woke late (`faults.Waits`): this machine was not
    the cluster asked for when more than `OVERRUN_LIMIT` of either did, and the run says
    so; absent when nothing was timed or waited. And its `hub`: a hub's handling of a
    message as measured (from taking it to asking for the next: the server's apply and
    bookkeeping) and its process's CPU per message (every thread: receiving, handling,
    replying; what `cluster.hub_ms` prices in the simulator), absent without a hub. And its
    `cycle`: a stepping rank's step and all it does until its next, over its steps from
    its first to its last, the mean over the ranks that step: the process's CPU (every
    thread) and the wall time a step (what `stalebench calibrate` keeps beside the
    `cluster.overhead_ms` it fits); absent in a run no rank stepped twice in."""
    steps = overran = handled = waits = late = cycles = 0
    handling_s = cpu_s = cycle_cpu_s = cycle_wall_s = 0.0
    for r in range(world):
        key = f"{OVERRUN_KEY}/{r}"
        with contextlib.suppress(Exception):
            if store.check([key]):
                n, k, h, s, c, w, lw, cn, cc, cw = store.get(key).decode().split()
                steps, overran = steps + int(n), overran + int(k)
                handled, handling_s = handled + int(h), handling_s + float(s)
                cpu_s = max(cpu_s, float(c))  # the hub's (one hub a run)
                waits, late = waits + int(w), late + int(lw)
                cycles, cycle_cpu_s = cycles + int(cn), cycle_cpu_s + float(cc)
                cycle_wall_s += float(cw)
    if steps or waits:
        summary["overrun"] = {
            "steps": steps,
            "overran": overran,
            "fraction": round(overran / steps, 4) if steps else 0.0,
            "waits": waits,
            "late": late,
            "late_fraction": round(late / waits, 4) if waits else 0.0,
            "limit": OVERRUN_LIMIT,
        }
    if handled:
        summary["hub"] = {
            "messages": handled,
            "handling_ms": round(1000 * handling_s / handled, 4),
            "cpu_ms": round(1000 * cpu_s, 4),
        }
    if cycles:
        summary["cycle"] = {
            "steps": cycles,
            "cpu_ms": round(1000 * cycle_cpu_s / cycles, 4),
            "wall_ms": round(1000 * cycle_wall_s / cycles, 4),
        }
    if steps or waits or handled or cycles:
        write_json(run_dir / "summary.json", summary)
    return summary


def _shared_memory() -> Path | None:
    """A fresh directory in shared memory for the run's mailboxes (None without one),
    named after this process; those of processes gone (killed before they removed theirs)
    are removed."""
    if not Path(SHM).is_dir():
        return None
    for old in Path(SHM).glob("stalebench-*-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"stalebench-{os.getpid()}-", dir=SHM))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _store(cfg: RunConfig) -> dist.TCPStore:
    """The rendezvous store, listening on `cfg.listen_host` only (loopback by default) at a
    free port: the socket is bound here and handed over to the store, which then owns it
    (torch binds every interface when it opens its own)."""
    listener = socket.create_server((cfg.listen_host, 0), backlog=128)
    port = listener.getsockname()[1]
    return dist.TCPStore(
        cfg.listen_host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=cfg.timeout_s),
        master_listen_fd=listener.detach(),
    )


def _stop(procs) -> None:
    """Every rank ends: SIGTERM, then SIGKILL for one still alive 5 s later."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def _supervise(cfg: RunConfig, engine, procs, store: dist.Store) -> tuple[str | None, str | None]:
    """Wait for rank 0; (status, error) when the supervisor must end the run itself, (None,
    error) when rank 0 ended it (`error`: what the supervisor saw of the other ranks)."""
    # Longest a healthy run can take: the budget, then start-up, a stop, the evaluation.
    budget_s = cfg.budget.max_wall_s
    allowed_s = budget_s + 2 * cfg.timeout_s + cfg.grace_s if budget_s else None
    deadline = time.monotonic() + allowed_s if allowed_s else None
    error, failed_at, run_dir = None, None, Path(cfg.run_dir)
    marked: set[int] = set()
    while procs[0].exitcode is None:
        time.sleep(0.05)
        for r, p in enumerate(procs):  # the ranks left need not wait for it (a quorum)
            if p.exitcode not in (None, 0) and r not in marked:
                marked.add(r)
                mark_dead(store, r)
        dead = [
            r
            for r, p in enumerate(procs[1:], 1)
            if p.exitcode not in (None, 0) and not engine.survives_loss_of(r)
        ]
        if dead and failed_at is None:
            # the cause before its consequences: a rank killed by a signal or an injected
            # fault, not a neighbour that then lost it (a pipeline stage exits with 1)
            codes = {r: procs[r].exitcode for r in dead}
            r = min(dead, key=lambda r: (0 < codes[r] != FAULT_EXIT, r))
            error = f"{engine.rank_name(r)} (pid {procs[r].pid}) exited with " + _exit(codes[r])
            error += _why(run_dir, r) if codes[r] == 1 else ""
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > min(cfg.timeout_s, 15):
            return "failed", error  # rank 0 did not wind down in time: stop it ourselves
        if deadline is not None and time.monotonic() > deadline:
            return "timeout", f"the run did not end within {allowed_s:.0f} s"
    if procs[0].exitcode != 0:
        first = f"{engine.rank_name(0)} exited with {_exit(procs[0].exitcode)}"
        first += _why(run_dir, 0) if procs[0].exitcode == 1 else ""
        return "failed", first + (f"; {error}" if error else "")
    return None, error


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    if code == FAULT_EXIT:
        return f"code {code} (a fault injected by cluster.faults)"
    return f"code {code}"


def read_summary(cfg: RunConfig, engine, error: str | None = None) -> dict[str, Any]:
    """summary.json of a run whose ranks have ended; when rank 0 died before writing it,
    one is written from the events with status failed (and `error`, what was seen)."""
    run_dir = Path(cfg.run_dir)
    path = run_dir / "summary.json"
    if not path.exists():
        return finalize(
            run_dir,
            meta(cfg, engine.num_workers),
            "failed",
            error or f"{engine.rank_name(0)} ended without a summary",
            cfg.budget.target_accuracy,
        )
    summary = json.loads(path.read_text())
    if error and summary["status"] == "failed" and error not in (summary["error"] or ""):
        summary["error"] = f"{summary['error']}; {error}"  # what the supervisor saw too
        write_json(path, summary)
    return summary

"""The real runtime: one OS process per role over torch.distributed (gloo, CPU tensors).

Rank 0 serves (the ParameterServer state machine), ranks 1..N are workers. `launch` starts
them with torch.multiprocessing on this machine and supervises them; under `torchrun` each
rank enters through `run_rank` with RANK/WORLD_SIZE from the environment.

Wire format: one float32 tensor per message, HEADER slots then a model-sized payload.
Integer header slots are written through an int32 view, so clocks and versions are exact.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stalebench.algorithms.base import UPDATES
from stalebench.config import RunConfig
from stalebench.engines.ps import Push
from stalebench.errors import RunError
from stalebench.experiment import Job, meta
from stalebench.metrics.summary import finalize, write_json
from stalebench.runtime.allreduce import replica
from stalebench.runtime.common import (
    HEADER,
    RunRecord,
    diverged,
    flatten_parameters,
    gradient,
    pad_to,
    parameter_server,
    spent,
)

log = logging.getLogger("stalebench")

# int slots: 0 kind, 1 clock (push) / version (reply), 2 version read (push)
# float slots: 3 loss, 4 compute_s, 5 rtt_s, 6 paused_s
PUSH, PARAMS, STOP = 1, 2, 3


class Transport:
    """Point-to-point messages over the default process group; every receive has a timeout
    (after one, the group is unusable: the run ends, as PITFALLS.md says)."""

    def __init__(self, timeout_s: float, engine: str = "ps"):
        self.timeout = timedelta(seconds=timeout_s)
        self.engine = engine
        self.bytes_sent = 0

    def lost(self, rank: int, exc: Exception) -> RunError:
        return RunError(f"{rank_name(self.engine, rank)} lost: {_brief(exc)}")

    def send(self, buf: torch.Tensor, dst: int) -> None:
        try:
            dist.send(buf, dst)
        except Exception as exc:
            raise self.lost(dst, exc) from exc
        self.bytes_sent += buf.numel() * buf.element_size()

    def isend(self, buf: torch.Tensor, dst: int):
        """Start a send; the caller keeps `buf` alive until `wait(work, dst)`."""
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


def _brief(exc: Exception) -> str:
    """gloo's message without its source location and advice: '[file:line] What. Advice.'"""
    text = str(exc).split("] ", 1)[-1]
    return text.split(". ", 1)[0].strip()


def _ints(buf: torch.Tensor) -> torch.Tensor:
    return buf[:HEADER].view(torch.int32)


class Receiver(threading.Thread):
    """Gloo completes a posted receive only through wait(), so the server waits on each
    worker in a thread of its own. It posts the next receive only once armed (after the
    server replied), so its timeout measures the worker's silence, not barrier holds."""

    def __init__(self, transport: Transport, worker: int, size: int, inbox: queue.Queue):
        super().__init__(daemon=True, name=f"recv-worker-{worker}")
        self.transport, self.worker, self.size, self.inbox = transport, worker, size, inbox
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
            buf = torch.empty(self.size)
            try:  # the server judges silence itself (it knows whom it waits for): no
                # gloo timeout here, which would also break the other workers' receives
                self.transport.recv(buf, self.worker + 1, timedelta(days=1))
            except Exception as exc:  # a dead or silent peer: the server ends the run
                self.inbox.put((self.worker, exc))
                return
            self.inbox.put((self.worker, buf))


class Server:
    """Rank 0: feeds arriving pushes to the ParameterServer, sends its replies, keeps the
    budget, snapshots θ for evaluation, and writes the run directory."""

    def __init__(self, job: Job, run_dir: Path, transport: Transport):
        cfg = job.cfg
        self.job, self.cfg, self.transport = job, cfg, transport
        self.n = cfg.cluster.num_workers
        self.record = RunRecord(job, run_dir)
        self.model, self.ps = parameter_server(job, self.record.events.emit)
        self.snapshots = self.record.snapshots
        self.size = HEADER + self.ps.params.numel()
        self.inbox: queue.Queue = queue.Queue()
        self.receivers = [Receiver(transport, w, self.size, self.inbox) for w in range(self.n)]
        self.out = torch.empty(self.size)
        self.active = set(range(self.n))  # workers not yet sent STOP
        self.stopping = False

    def serve(self) -> dict[str, Any]:
        status, error = "completed", None
        self.t0 = time.perf_counter()
        try:
            status = self._loop()
        except Exception as exc:
            status, error = "failed", str(exc)
            log.error("server: %s\n%s", exc, traceback.format_exc())
            self._stop(set(self.ps.held))
        return self.record.finish(
            self.model,
            self.ps.params,
            self.ps.version,
            self.now(),
            status,
            error,
            bytes_sent=self.transport.bytes_sent,
        )

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _loop(self) -> str:
        budget, ps = self.cfg.budget, self.ps
        for r in self.receivers:
            r.start()
        self.snapshots.maybe(0.0, 0, ps.params)
        self._send(ps.start(0.0))
        status = "completed"
        while self.active:
            item = self._next(0.0 if self.stopping else budget.max_wall_s)
            if item is None:  # the wall budget ran out while no push arrived
                self._stop(set(ps.held))
                continue
            w, buf = item
            if self.stopping:  # a push that crossed our decision to stop: discard it
                self._stop({w})
                continue
            push = self._decode(w, buf)
            if float(buf[6]) > 0:
                self.record.events.emit(
                    "worker", self.now(), worker=w, event="pause", duration_s=float(buf[6])
                )
            replies = ps.on_push(push, self.now())
            t = self.now()
            snapped = self.snapshots.maybe(t, ps.version, ps.params)
            if diverged(push.loss, ps.params if snapped else None):  # θ checked at snapshots
                status = "diverged"
            if status == "diverged" or spent(budget, ps.version, t):
                self._stop(set(ps.held) | {r.worker for r in replies})
            else:
                self._send(replies)
        return status

    def _next(self, max_wall_s: float):
        """The next (worker, push buffer); None when the wall budget ran out first; a
        RunError naming the worker when one stays silent longer than timeout_s."""
        timeout = self.cfg.timeout_s
        while True:
            awaited = [
                r for r in self.receivers if r.worker in self.active and r.armed_at is not None
            ]
            first = min(awaited, key=lambda r: r.armed_at, default=None)
            now = self.now()
            wait = first.armed_at + timeout - now if first else timeout
            if max_wall_s:
                wait = min(wait, max_wall_s - now)
            try:
                w, item = self.inbox.get(timeout=max(wait, 0.0) + 1e-3)
            except queue.Empty:
                now = self.now()
                if max_wall_s and now >= max_wall_s:
                    return None
                if first and now - first.armed_at >= timeout:
                    raise RunError(
                        f"worker {first.worker} (rank {first.worker + 1}) silent for "
                        f"{now - first.armed_at:.1f} s, more than timeout_s={timeout:g}"
                    ) from None
                continue
            self.receivers[w].armed_at = None
            if isinstance(item, Exception):
                if w not in self.active:
                    continue  # it had been told to stop: its exit is not a failure
                raise item
            return w, item

    def _decode(self, w: int, buf: torch.Tensor) -> Push:
        ints = _ints(buf)
        if int(ints[0]) != PUSH:
            raise RunError(f"worker {w} sent message kind {int(ints[0])}, expected a push")
        return Push(
            worker=w,
            clock=int(ints[1]),
            version_read=int(ints[2]),
            grad=buf[HEADER:],
            loss=float(buf[3]),
            compute_s=float(buf[4]),
            rtt_s=float(buf[5]),
        )

    def _send(self, replies) -> None:
        for r in replies:
            _ints(self.out)[:3] = torch.tensor([PARAMS, r.version, 0], dtype=torch.int32)
            self.out[HEADER:] = r.params
            self.transport.send(self.out, r.worker + 1)
            self.receivers[r.worker].arm(self.now())

    def _stop(self, waiting: set[int]) -> None:
        """Tell the workers waiting for a reply to stop; the others (still computing) are
        told at their next push."""
        self.stopping = True
        _ints(self.out)[:3] = torch.tensor([STOP, self.ps.version, 0], dtype=torch.int32)
        for w in sorted(waiting & self.active):
            self.active.discard(w)
            self.receivers[w].close()
            try:
                self.transport.send(self.out, w + 1)
                self.record.events.emit("worker", self.now(), worker=w, event="stop")
            except Exception as exc:  # best effort on the failure path
                log.warning("could not stop worker %d: %s", w, exc)


def work(job: Job, worker: int, transport: Transport) -> None:
    """Rank worker+1: read θ, compute a gradient on the next minibatch of its shard, pad the
    step to the profile's compute time, push it with the version read; until told to stop."""
    cfg = job.cfg
    device = job.device(worker)
    model = job.model().to(device)
    flat = flatten_parameters(model)
    params = list(model.parameters())
    size = HEADER + flat.numel()
    inbox, out = torch.empty(size), torch.empty(size)
    batches = job.batches(worker)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    rule_state: dict = {}  # the update rule's worker-side state (e.g. DANA-Slim's momentum)
    profile, nbytes = job.profile, 4 * size
    faults = profile.faults(worker)
    # One throwaway step before t = 0, so first-call set-up is not timed as compute.
    warmup = slice(0, cfg.dataset.batch_size)
    gradient(model, params, (job.splits.x_train[warmup], job.splits.y_train[warmup]), device)
    clock, pushed_at, t0 = 0, None, None
    while True:
        transport.recv(inbox, 0)
        time.sleep(profile.pull_s(nbytes))  # the network model's pull delay
        received = time.perf_counter()
        t0 = received if t0 is None else t0
        kind, version = int(_ints(inbox)[0]), int(_ints(inbox)[1])
        if kind == STOP:
            return
        paused = _strike(faults, received - t0, worker)
        start = time.perf_counter()
        flat.copy_(inbox[HEADER:])
        grad, loss_value = gradient(model, params, next(batches), device)
        out[HEADER:] = rule_cls.worker_message(cfg.algorithm.update, grad, rule_state)
        target_s = profile.step_s(worker)
        pad_to(start, target_s)  # the profile's slowness, beyond the real compute
        compute = time.perf_counter() - start
        rtt = received - pushed_at if pushed_at is not None else 0.0
        _ints(out)[:3] = torch.tensor([PUSH, clock, version], dtype=torch.int32)
        out[3:7] = torch.tensor([loss_value, compute, rtt, paused])
        pushed_at = time.perf_counter()
        time.sleep(profile.push_s(nbytes))  # the network model's push delay
        transport.send(out, 0)
        clock += 1


FAULT_EXIT = 3  # exit code of a worker that an injected fault killed


def _strike(faults: list, now: float, worker: int) -> float:
    """Apply the faults due by `now` (run seconds): pause (sleep) or die (exit); returns the
    seconds paused."""
    paused = 0.0
    while faults and faults[0].at_s <= now:
        fault = faults.pop(0)
        log.warning("worker %d: injected fault %s at %.3f s", worker, fault.action, now)
        if fault.action == "die":
            logging.shutdown()
            os._exit(FAULT_EXIT)
        time.sleep(fault.duration_s)
        paused += fault.duration_s
    return paused


def _setup_logging(run_dir: Path, rank: int, level: str) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / f"rank-{rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)


def run_rank(cfg: RunConfig, rank: int, world_size: int, store: dist.Store | None) -> int:
    """One process's part in a run; returns its exit code. With `store` None the process
    group forms from the environment (torchrun); rank 0 then tells the others the run dir."""
    torch.set_num_threads(cfg.num_threads)
    if world_size != world_size_of(cfg):
        raise RunError(
            f"world size {world_size} != {world_size_of(cfg)}, what engine="
            f"{cfg.engine} needs for cluster.num_workers={cfg.cluster.num_workers}"
        )
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
    if store is None:  # torchrun: Hydra made a directory per rank; rank 0's is the run's
        shared = [cfg.run_dir]
        dist.broadcast_object_list(shared, src=0)
        cfg.run_dir = shared[0]
    run_dir = Path(cfg.run_dir)
    _setup_logging(run_dir, rank, "INFO")
    log.info("rank %d of %d (pid %d): process group ready", rank, world_size, os.getpid())
    transport = Transport(cfg.timeout_s, cfg.engine)
    job = Job.build(cfg)
    summary = None
    try:
        if cfg.engine == "allreduce":
            summary = replica(job, rank, run_dir)
        elif cfg.engine == "pipeline":
            from stalebench.runtime.pipeline import stage_process

            summary = stage_process(job, rank, run_dir, transport)
        elif rank == 0:
            summary = Server(job, run_dir, transport).serve()
        else:
            work(job, rank - 1, transport)
        log.info(
            "%s done%s", rank_name(cfg.engine, rank), f": {summary['status']}" if summary else ""
        )
    except Exception as exc:
        log.error("%s: %s\n%s", rank_name(cfg.engine, rank), exc, traceback.format_exc())
        return 1
    if summary and summary["status"] != "completed":
        return 0  # a failed run is reported in summary.json; peers may be gone, skip teardown
    dist.destroy_process_group()
    return 0


def world_size_of(cfg: RunConfig) -> int:
    if cfg.engine == "pipeline":
        return cfg.algorithm.pipeline.stages
    n = cfg.cluster.num_workers
    return n if cfg.engine == "allreduce" else n + 1


def rank_name(engine: str, rank: int) -> str:
    """How errors and logs name a rank: the parameter server is rank 0, worker w rank w + 1;
    under allreduce every rank is a worker; in a pipeline, rank k is stage k."""
    if engine == "allreduce":
        return f"worker {rank} (rank {rank})"
    if engine == "pipeline":
        return f"stage {rank} (rank {rank})"
    return "server (rank 0)" if rank == 0 else f"worker {rank - 1} (rank {rank})"


def _child(cfg: RunConfig, rank: int, world_size: int, host: str, port: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: stay on loopback
    store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=cfg.timeout_s))
    code = run_rank(cfg, rank, world_size, store)
    logging.shutdown()
    os._exit(code)  # no interpreter teardown: gloo threads must not delay or hang the exit


def launch(cfg: RunConfig) -> dict[str, Any]:
    """Start the server and the workers as spawned processes on this machine, supervise
    them, and make sure summary.json exists and no process outlives the run."""
    import torch.multiprocessing as mp

    run_dir = Path(cfg.run_dir)
    world = world_size_of(cfg)
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=cfg.timeout_s),
    )  # port 0: never collides
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(
            target=_child,
            args=(cfg, r, world, "127.0.0.1", store.port),
            daemon=True,
            name=f"stalebench-rank-{r}",
        )
        for r in range(world)
    ]
    # Longest a healthy run can take: start-up, the budget, a stop, the evaluation.
    allowed_s = cfg.budget.max_wall_s + 2 * cfg.timeout_s + 120 if cfg.budget.max_wall_s else None
    deadline = time.monotonic() + allowed_s if allowed_s else None
    status, error = None, None
    try:
        for p in procs:
            p.start()
        failed_at = None
        while procs[0].exitcode is None:
            time.sleep(0.05)
            dead = [r for r, p in enumerate(procs[1:], 1) if p.exitcode not in (None, 0)]
            if dead and failed_at is None:
                # the cause before its consequences: a rank killed by a signal or an injected
                # fault, not a neighbour that then lost it (a pipeline stage exits with 1)
                codes = {r: procs[r].exitcode for r in dead}
                r = min(dead, key=lambda r: (0 < codes[r] != FAULT_EXIT, r))
                error = f"{rank_name(cfg.engine, r)} (pid {procs[r].pid}) exited with " + _exit(
                    procs[r].exitcode
                )
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > min(cfg.timeout_s, 15):
                status = "failed"  # the server did not wind down in time: stop it ourselves
                break
            if deadline is not None and time.monotonic() > deadline:
                status, error = "timeout", f"the run did not end within {allowed_s:.0f} s"
                break
        if procs[0].exitcode not in (None, 0) and status is None:
            status = "failed"
            error = f"{rank_name(cfg.engine, 0)} exited with {_exit(procs[0].exitcode)}" + (
                f"; {error}" if error else ""
            )
    except KeyboardInterrupt:
        status, error = "failed", "interrupted"
        raise
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        if status is not None:
            finalize(run_dir, meta(cfg), status, error, cfg.budget.target_accuracy)
    summary = _read_summary(run_dir, cfg, error)
    if error and summary["status"] == "failed" and error not in (summary["error"] or ""):
        summary["error"] = f"{summary['error']}; {error}"  # what the supervisor saw too
        write_json(run_dir / "summary.json", summary)
    return summary


def _exit(code: int | None) -> str:
    import signal

    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    if code == FAULT_EXIT:
        return f"code {code} (a fault injected by cluster.faults)"
    return f"code {code}"


def _read_summary(run_dir: Path, cfg: RunConfig, error: str | None) -> dict[str, Any]:
    import json

    path = run_dir / "summary.json"
    if not path.exists():  # the server died before writing it: say so from the events
        return finalize(
            run_dir,
            meta(cfg),
            "failed",
            error or "server ended without a summary",
            cfg.budget.target_accuracy,
        )
    return json.loads(path.read_text())

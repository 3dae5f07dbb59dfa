"""The pipeline engine in both runtimes.

real: one OS process per stage over torch.distributed (gloo; a stage computes on its own
GPU when there is one, and activations and gradients travel as CPU tensors). Stage k
receives hidden states from k−1 and gradients from k+1 and sends each on with `isend`, so
the 1F1B pattern (send forward, then wait for a gradient) cannot deadlock. Stage 0 feeds
the microbatches and decides when to stop: a STOP message travels down the pipeline and
every stage drains its in-flight microbatches, so all stages apply the same number of
updates. Every stage appends its own `update` events to events.jsonl; at the end the stages
send their weight snapshots to stage 0, which evaluates the whole model and writes
summary.json.

sim: the same `Stage` calls in one process in microbatch order (ALGORITHMS.md §10.7), each
stage forwarding at the version the schedule gives it; virtual time comes from a replay of
the schedule with per-op costs from cluster.compute_ms.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stalebench.config import RunConfig
from stalebench.data import shard_batches
from stalebench.engines.pipeline import Applied, Stage, Timeline, ops, split
from stalebench.errors import RunError
from stalebench.evaluation import Snapshot
from stalebench.experiment import Job, meta
from stalebench.metrics.events import EventLog
from stalebench.metrics.summary import finalize
from stalebench.runtime.common import HEADER, RunRecord, spent

STOP = -1  # a forward message's microbatch slot: no more microbatches


def microbatches(job: Job) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The pipeline's one stream of microbatches: minibatches of dataset.batch_size over the
    whole training split, each cut into algorithm.pipeline.microbatches pieces when the
    schedule flushes (one piece otherwise)."""
    cfg = job.cfg
    parts = cfg.algorithm.pipeline.per_step
    for x, y in shard_batches(job.splits, 0, 1, cfg.dataset.batch_size, cfg.seed, "replicated"):
        yield from zip(x.chunk(parts), y.chunk(parts), strict=True)


def build_stages(job: Job) -> tuple[torch.nn.Sequential, list[torch.nn.Sequential]]:
    """The whole model (θ₀ seeded, identical in every process) and its stage slices."""
    model = job.model()
    return model, split(model, job.cfg.algorithm.pipeline.stages)


def update_event(stage: Stage, m: int, a: Applied, loss: float, **timing: float) -> dict:
    return dict(
        worker=stage.index,
        clock=m,
        version=a.version,
        lag=a.lag,
        loss=loss,
        weight_gap=a.weight_gap,
        grad_norm=a.grad_norm,
        **timing,
    )


def snapshot_due(cfg: RunConfig, version: int) -> bool:
    return version % cfg.eval.every_updates == 0


def summary_extra(cfg: RunConfig) -> dict[str, Any]:
    pipe = cfg.algorithm.pipeline
    return {
        "pipeline": {
            "stages": pipe.stages,
            "schedule": pipe.schedule,
            "weight_stashing": pipe.weight_stashing,
            "microbatches": pipe.per_step,
            "delays": [pipe.delay(k) for k in range(pipe.stages)],
        }
    }


# ---------------------------------------------------------------------------------- sim


def simulate(cfg: RunConfig) -> dict[str, Any]:
    torch.set_num_threads(cfg.num_threads)
    job = Job.build(cfg)
    pipe, budget = cfg.algorithm.pipeline, cfg.budget
    record = RunRecord(job, Path(cfg.run_dir), flush_s=0.2)
    model, modules = build_stages(job)
    cpu = torch.device("cpu")
    stages = [Stage(k, mod, pipe, cfg.algorithm.optimizer, cpu) for k, mod in enumerate(modules)]
    per = pipe.per_step
    cost = cfg.cluster.compute_ms / 1000 / per  # one microbatch's forward + backward, a stage
    clock = Timeline(pipe, cost / 3, 2 * cost / 3)
    stream = microbatches(job)
    status, t, step, loop_start = "completed", 0.0, 0, time.perf_counter()
    record.snapshots.take(0.0, 0, torch.cat([s.w for s in stages]))
    while not spent(budget, step, t):
        t_next = clock.update_time(0, step)
        if budget.max_wall_s and t_next > budget.max_wall_s:
            t = budget.max_wall_s
            break
        losses = []
        for j in range(per):
            m = step * per + j
            x, y = next(stream)
            for s in stages:
                x = s.forward(m, x, s.forward_version(m), y)
            grad = None
            for s in reversed(stages):
                grad, loss = s.backward(m, grad)
                if s.last:
                    losses.append(loss)
        loss = sum(losses) / per
        for s in stages:
            a, at = s.apply(), clock.update_time(s.index, step)
            busy = per * cost  # the step's forwards and backwards; the rest is bubble
            idle = at - (clock.update_time(s.index, step - 1) if step else 0.0) - busy
            record.events.emit(
                "update",
                at,
                **update_event(s, step, a, loss, compute_s=busy, wait_s=max(idle, 0.0), comm_s=0.0),
            )
        step, t = step + 1, t_next
        if snapshot_due(cfg, step):
            record.snapshots.take(t, step, torch.cat([s.w for s in stages]))
        if not math.isfinite(loss):
            status = "diverged"
            break
    return record.finish(
        model,
        torch.cat([s.w for s in stages]),
        step,
        t,
        status,
        None,
        summary_extra={**summary_extra(cfg), "sim_loop_s": time.perf_counter() - loop_start},
        bytes_sent=0,
        virtual_time=True,
    )


# --------------------------------------------------------------------------------- real


class Links:
    """A stage's two neighbours: fixed-size float32 messages (HEADER slots, then a hidden
    state or its gradient), sends asynchronous, every receive with the run's timeout."""

    def __init__(self, transport, shape: tuple[int, ...]):
        self.transport = transport
        self.shape, self.size = shape, HEADER + math.prod(shape)
        self.sends: list[tuple[Any, int, torch.Tensor]] = []  # (work, destination, buffer)

    def send(self, dst: int, m: int, payload: torch.Tensor | None, loss: float = 0.0) -> float:
        start = time.perf_counter()
        buf = torch.zeros(self.size)
        buf[:HEADER].view(torch.int32)[0] = m
        buf[1] = loss
        if payload is not None:
            buf[HEADER:] = payload.reshape(-1).cpu()
        self.sends = [s for s in self.sends if not s[0].is_completed()]
        self.sends.append((self.transport.isend(buf, dst), dst, buf))
        return time.perf_counter() - start

    def recv(self, src: int) -> tuple[int, torch.Tensor, float, float]:
        """(microbatch or STOP, payload, loss slot, seconds waited)."""
        start = time.perf_counter()
        buf = torch.empty(self.size)
        self.transport.recv(buf, src)
        m = int(buf[:HEADER].view(torch.int32)[0])
        return m, buf[HEADER:].view(self.shape), float(buf[1]), time.perf_counter() - start

    def flush(self) -> None:
        for work, dst, _ in self.sends:
            self.transport.wait(work, dst)
        self.sends = []


def stage_process(job: Job, rank: int, run_dir: Path, transport) -> dict[str, Any] | None:
    """Stage `rank` of a real pipeline run; stage 0 returns the summary."""
    cfg = job.cfg
    pipe, budget, K = cfg.algorithm.pipeline, cfg.budget, cfg.algorithm.pipeline.stages
    model, modules = build_stages(job)
    per = pipe.per_step
    with torch.no_grad():  # what crosses a stage boundary: the first stage's output shape
        ids = job.splits.x_train[: cfg.dataset.batch_size // per]
        shape = tuple(modules[0](ids).shape)
    stage = Stage(rank, modules[rank], pipe, cfg.algorithm.optimizer, job.device(rank))
    links = Links(transport, shape)
    record = RunRecord(job, run_dir) if rank == 0 else None
    dist.barrier()  # the run directory and events.jsonl exist before anyone appends
    events = record.events if record else EventLog(run_dir / "events.jsonl")
    stream = microbatches(job)
    snaps: dict[int, torch.Tensor] = {0: stage.w.clone()}
    times: dict[int, float] = {0: 0.0}
    status, error, issued, stopped, losses = "completed", None, 0, False, []
    t0 = time.perf_counter()
    now = lambda: time.perf_counter() - t0  # noqa: E731
    compute = wait = comm = 0.0
    try:
        for op, m in ops(rank, pipe):
            if op == "F":
                if stopped:
                    continue
                if rank == 0:
                    if m % per == 0 and (spent(budget, m // per, now()) or status == "diverged"):
                        stopped = True
                        if K > 1:
                            comm += links.send(1, STOP, None)
                        continue
                    x, y = next(stream)
                else:
                    got, x, _, waited = links.recv(rank - 1)
                    wait += waited
                    if got == STOP:
                        stopped = True
                        if not stage.last:
                            comm += links.send(rank + 1, STOP, None)
                        continue
                    if got != m:
                        raise RunError(f"stage {rank} expected microbatch {m}, got {got}")
                    _, y = next(stream)
                if stage.version != stage.forward_version(m):
                    raise RunError(f"stage {rank} holds version {stage.version} at F({m})")
                start = time.perf_counter()
                out = stage.forward(m, x, stage.version, y)
                compute += time.perf_counter() - start
                if not stage.last:
                    comm += links.send(rank + 1, m, out)
                issued = m + 1
            elif op == "B":
                if m >= issued:
                    break  # every microbatch that went in has come back
                grad_out, loss = None, float("nan")
                if not stage.last:
                    got, grad_out, loss, waited = links.recv(rank + 1)
                    wait += waited
                    if got != m:
                        raise RunError(f"stage {rank} expected the gradient of {m}, got {got}")
                start = time.perf_counter()
                grad_in, own = stage.backward(m, grad_out)
                compute += time.perf_counter() - start
                loss = own if stage.last else loss
                losses.append(loss)
                if rank > 0:
                    comm += links.send(rank - 1, m, grad_in, loss)
            else:  # "U": the update of microbatch (1F1B) or step (flush) m
                start = time.perf_counter()
                applied = stage.apply()
                compute += time.perf_counter() - start
                loss, losses = sum(losses) / len(losses), []
                t = now()
                events.emit(
                    "update",
                    t,
                    **update_event(
                        stage, m, applied, loss, compute_s=compute, wait_s=wait, comm_s=comm
                    ),
                )
                compute = wait = comm = 0.0
                if snapshot_due(cfg, stage.version):
                    snaps[stage.version], times[stage.version] = stage.w.clone(), t
                if rank == 0 and not math.isfinite(loss):
                    status = "diverged"
        links.flush()
        t_end = now()
        snaps[stage.version], times[stage.version] = stage.w.clone(), t_end
    except RunError as exc:
        if record is None:
            raise
        record.events.emit("system", now(), event="error", error=str(exc))
        record.events.emit("system", now(), event="end", status="failed", updates=stage.version)
        record.events.close()
        return finalize(run_dir, meta(cfg), "failed", str(exc), budget.target_accuracy)
    versions = sorted(snaps)
    if record is None:
        events.close()
        transport.send(torch.stack([snaps[v] for v in versions]).cpu(), 0)
        return None
    parts = [torch.stack([snaps[v] for v in versions]).cpu()]
    for k in range(1, K):
        buf = torch.empty(len(versions), stage_size(modules[k]))
        transport.recv(buf, k)
        parts.append(buf)
    full = torch.cat(parts, dim=1)
    record.snapshots.taken = [Snapshot(times[v], v, full[i]) for i, v in enumerate(versions)]
    return record.finish(
        model,
        full[-1],
        stage.version,
        t_end,
        status,
        error,
        summary_extra=summary_extra(cfg),
        bytes_sent=transport.bytes_sent,
    )


def stage_size(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

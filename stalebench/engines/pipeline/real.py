"""The pipeline in real processes: one OS process per stage over torch.distributed
(gloo; a stage computes on its own GPU when there is one, and activations and gradients
travel as CPU tensors). Stage k receives hidden states from k−1 and gradients from k+1 and
sends each on with `isend`, so the 1F1B pattern (send forward, then wait for a gradient)
cannot deadlock. Stage 0 feeds the microbatches and decides when to stop: a STOP message
travels down the pipeline and every stage drains its in-flight microbatches, so all
stages apply the same number of updates. Every stage appends its own `update` events to
events.jsonl; at the end the stages send their weight snapshots to stage 0, which
evaluates the whole model and writes summary.json."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from stalebench.engines.pipeline.run import (
    HEADER,
    STOP,
    build_stages,
    microbatches,
    snapshot_due,
    summary_extra,
    update_event,
)
from stalebench.engines.pipeline.stage import Stage, ops
from stalebench.errors import RunError
from stalebench.evaluation import Snapshot
from stalebench.job import Job
from stalebench.metrics.events import EventLog
from stalebench.runtime.record import RunRecord, spent


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


class StageRun:
    """One stage's part in a real pipeline run: its ops in schedule order, the messages they
    need, an `update` event per update, and the weight snapshots for the evaluation."""

    def __init__(self, job: Job, stage: Stage, links: Links, events: EventLog):
        self.cfg, self.stage, self.links, self.events = job.cfg, stage, links, events
        self.rank, self.per = stage.index, job.cfg.algorithm.pipeline.per_step
        self.stream = microbatches(job)
        self.snaps: dict[int, torch.Tensor] = {0: stage.w.clone()}  # version → weights
        self.times: dict[int, float] = {0: 0.0}  # version → when this stage reached it
        self.diverged, self.issued, self.stopped, self.losses = False, 0, False, []
        self.compute = self.wait = self.comm = 0.0  # since the last update
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def run(self) -> None:
        """Until every microbatch that went in has come back through this stage."""
        for op, m in ops(self.rank, self.cfg.algorithm.pipeline):
            if op == "F" and not self.stopped:
                self.forward(m)
            elif op == "B":
                if m >= self.issued:
                    break
                self.backward(m)
            elif op == "U":  # the update of microbatch (1F1B) or step (flush) m
                self.update(m)
        self.links.flush()
        self.snapshot(self.now())

    def stop(self) -> None:
        """No more microbatches: tell the next stage, then drain."""
        self.stopped = True
        if not self.stage.last:
            self.comm += self.links.send(self.rank + 1, STOP, None)

    def forward(self, m: int) -> None:
        stage = self.stage
        if self.rank == 0:  # the first stage feeds, and decides when to stop
            at_step = m % self.per == 0
            if at_step and (spent(self.cfg.budget, m // self.per, self.now()) or self.diverged):
                return self.stop()
            x, y = next(self.stream)
        else:
            got, x, _, waited = self.links.recv(self.rank - 1)
            self.wait += waited
            if got == STOP:
                return self.stop()
            if got != m:
                raise RunError(f"stage {self.rank} expected microbatch {m}, got {got}")
            _, y = next(self.stream)
        if stage.version != stage.forward_version(m):
            raise RunError(f"stage {self.rank} holds version {stage.version} at F({m})")
        start = time.perf_counter()
        out = stage.forward(m, x, stage.version, y)
        self.compute += time.perf_counter() - start
        if not stage.last:
            self.comm += self.links.send(self.rank + 1, m, out)
        self.issued = m + 1

    def backward(self, m: int) -> None:
        grad_out, loss = None, float("nan")
        if not self.stage.last:  # the gradient, and the microbatch's loss, from downstream
            got, grad_out, loss, waited = self.links.recv(self.rank + 1)
            self.wait += waited
            if got != m:
                raise RunError(f"stage {self.rank} expected the gradient of {m}, got {got}")
        start = time.perf_counter()
        grad_in, own = self.stage.backward(m, grad_out)
        self.compute += time.perf_counter() - start
        self.losses.append(own if self.stage.last else loss)
        if self.rank > 0:
            self.comm += self.links.send(self.rank - 1, m, grad_in, self.losses[-1])

    def update(self, m: int) -> None:
        start = time.perf_counter()
        applied = self.stage.apply()
        self.compute += time.perf_counter() - start
        loss, self.losses = sum(self.losses) / len(self.losses), []
        t = self.now()
        timing = {"compute_s": self.compute, "wait_s": self.wait, "comm_s": self.comm}
        self.events.emit("update", t, **update_event(self.stage, m, applied, loss, **timing))
        self.compute = self.wait = self.comm = 0.0
        if snapshot_due(self.cfg, self.stage.version):
            self.snapshot(t)
        self.diverged = self.diverged or not math.isfinite(loss)

    def snapshot(self, t: float) -> None:
        self.snaps[self.stage.version], self.times[self.stage.version] = self.stage.w.clone(), t

    def stacked(self) -> torch.Tensor:
        """The snapshots, in version order, one row each."""
        return torch.stack([self.snaps[v] for v in sorted(self.snaps)]).cpu()


def stage_process(job: Job, rank: int, run_dir: Path, transport) -> dict[str, Any] | None:
    """Stage `rank` of a real pipeline run; stage 0 gathers every stage's snapshots,
    evaluates the whole model and returns the summary."""
    cfg = job.cfg
    model, modules = build_stages(job)
    with torch.no_grad():  # what crosses a stage boundary: the first stage's output shape
        ids = job.splits.x_train[: cfg.dataset.batch_size // cfg.algorithm.pipeline.per_step]
        shape = tuple(modules[0](ids).shape)
    stage = Stage(
        rank, modules[rank], cfg.algorithm.pipeline, cfg.algorithm.optimizer, job.device(rank)
    )
    record = RunRecord(job, run_dir) if rank == 0 else None
    transport.barrier()  # the run directory and events.jsonl exist before anyone appends
    events = record.events if record else EventLog(run_dir / "events.jsonl")
    run = StageRun(job, stage, Links(transport, shape), events)
    try:
        run.run()
    except RunError as exc:
        if record is None:
            raise
        return record.fail(run.now(), stage.version, str(exc))
    if record is None:
        events.close()
        transport.send(run.stacked(), 0)
        return None
    parts = [run.stacked()]
    for k in range(1, cfg.algorithm.pipeline.stages):
        parts.append(torch.empty(len(run.snaps), stage_size(modules[k])))
        transport.recv(parts[-1], k)
    full = torch.cat(parts, dim=1)
    versions = sorted(run.snaps)
    record.snapshots.taken = [Snapshot(run.times[v], v, full[i]) for i, v in enumerate(versions)]
    return record.finish(
        model,
        full[-1],
        stage.version,
        run.times[stage.version],
        "diverged" if run.diverged else "completed",
        None,
        summary_extra=summary_extra(cfg),
        bytes_sent=transport.bytes_sent,
    )


def stage_size(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

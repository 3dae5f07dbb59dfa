"""engine=pipeline's role, a stage's rank, written once for both runtimes
(`stalebench.runtime.world`).

The protocol: stage k runs its ops in schedule order (`stage.ops`): a forward receives the
hidden state of microbatch m from stage k−1 and sends its own on, a backward receives the
gradient and the microbatch's loss from k+1 and sends the gradient of its input back, an
update applies what the backwards kept. Sends never wait (isend), so the 1F1B pattern
cannot deadlock. Each forward and backward lasts its share of the profile's step
(cluster.compute_ms per minibatch and stage: a third forward, two thirds backward, as a
backward recomputes the forward); the schedule's bubbles are the time a stage waits for its
neighbours.

Stage 0 feeds the microbatches and decides the stop: a STOP message travels down the
pipeline and every stage drains its in-flight microbatches, so all stages apply the same
number of updates. Each stage writes its own `update` events; at the end every stage sends
its weight snapshots to stage 0, which evaluates the whole model and writes summary.json.
No spares: a stage lost ends the run unevaluated.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from stalebench.config import RunConfig
from stalebench.data import shard_batches
from stalebench.engines.pipeline.stage import Applied, Stage, ops, split
from stalebench.errors import RunError
from stalebench.evaluation import Snapshot
from stalebench.job import Job
from stalebench.runtime.driver import Ending, Role
from stalebench.runtime.record import spent
from stalebench.runtime.world import Op, World

# float32 slots before a message's payload: the microbatch (int32) in slot 0, the
# microbatch's loss (float64) in slots 2–3
HEADER = 8
STOP = -1  # a forward message's microbatch slot: no more microbatches


class StageProgram(Role):
    """Stage `world.rank` of a pipeline run: its ops, their messages, its update events and
    the weight snapshots for the evaluation."""

    def __init__(self, job: Job, world: World):
        self.job, self.world, self.rank = job, world, world.rank
        cfg, pipe = job.cfg, job.cfg.algorithm.pipeline
        self.pipe, self.per_step = pipe, pipe.per_step  # microbatches per step
        self.model, self.modules, shape = world.shared("stages", lambda: build_stages(job))
        self.shape, self.size = shape, HEADER + math.prod(shape)
        module, device = self.modules[self.rank], world.device
        self.numerics = job.numerics  # false: cost-only, every message its header alone
        self.stage = Stage(self.rank, module, pipe, cfg.algorithm.optimizer, device,
                           self.numerics)  # fmt: skip
        self.stream = microbatches(job)
        cost = cfg.cluster.compute_ms / 1000 / self.per_step  # a microbatch's F + B on a stage
        self.cost = {"F": cost / 3, "B": 2 * cost / 3}
        self.snapshots: dict[int, torch.Tensor] = {0: self.stage.w.clone()}  # version → weights
        self.times: dict[int, float] = {0: 0.0}  # version → when this stage reached it
        self.diverged, self.issued, self.stopped, self.losses = False, 0, False, []
        self.compute = self.wait = self.comm = 0.0  # since the last update
        # sends in flight, at most the schedule's bound (a stage never has more than
        # K + M of each direction undelivered), so waiting on the oldest never blocks
        self.sends: deque[tuple[Any, int]] = deque()
        self.window = 2 * (pipe.stages + pipe.microbatches)
        self.scheduled = False  # past the schedule: an error ends this rank

    def run(self) -> Op[Ending | None]:
        world, stage, record = self.world, self.stage, self.world.record
        yield from self.schedule()
        self.scheduled = True
        if not self.numerics:  # cost-only: no weights to gather and evaluate
            return None if record is None else self.ending(stage.w)
        mine = torch.stack([self.snapshots[v] for v in sorted(self.snapshots)]).cpu()
        if record is None:
            yield from world.wait((yield from world.isend(mine, 0)), 0)
            return None
        parts = [mine]
        for module in self.modules[1:]:
            size = sum(p.numel() for p in module.parameters())
            parts.append(torch.empty(len(self.snapshots), size))
            yield from world.recv(parts[-1], len(parts) - 1)
        full = torch.cat(parts, dim=1)
        record.snapshots.taken = [
            Snapshot(self.times[v], v, full[i]) for i, v in enumerate(sorted(self.snapshots))
        ]
        return self.ending(full[-1])

    def schedule(self) -> Op[None]:
        """The schedule's ops on this stage, until every microbatch that went in came back;
        its sends delivered, its last weights kept."""
        world = self.world
        for op, index in ops(self.rank, self.pipe):
            if op == "F" and not self.stopped:
                yield from self.forward(index)
            elif op == "B":
                if index >= self.issued:
                    break  # every microbatch that went in came back through this stage
                yield from self.backward(index)
            elif op == "U":  # the update of microbatch (1F1B) or step (flush) `index`
                yield from self.update(index)
        while self.sends:
            yield from world.wait(*self.sends.popleft())
        self.snapshot(world.now())

    def fail(self, exc: Exception) -> Op[Ending]:
        """A stage lost (a peer holding part of θ): the run ends unevaluated."""
        if self.scheduled or not isinstance(exc, RunError):
            raise exc
        return Ending(None, None, self.stage.version, self.world.now())
        yield  # unreachable: an op

    def ending(self, params: torch.Tensor) -> Ending:
        """Stage 0: the end of the run, the last weights `params` (the whole model's)."""
        # K − 1 stage boundaries, each a forward and a backward per microbatch, and one STOP
        traffic = (self.pipe.stages - 1) * (2 * self.issued + 1) * self.size * 4
        version = self.stage.version
        return Ending(self.model, params, version, self.times[version],
                      "diverged" if self.diverged else "completed",
                      summary_extra=summary_extra(self.job.cfg), bytes_sent=traffic)  # fmt: skip

    def send(
        self, dst: int, microbatch: int, payload: torch.Tensor | None, loss: float = 0.0
    ) -> Op[None]:
        if len(self.sends) >= self.window:
            yield from self.world.wait(*self.sends.popleft())
        buf = self.world.message(self.size, HEADER)
        buf[:1].view(torch.int32)[0] = microbatch
        buf[2:4].view(torch.float64)[0] = loss
        if payload is not None and self.numerics:
            buf[HEADER:].copy_(payload.reshape(-1))  # from a GPU: into host memory, once
        start = self.world.now()
        self.sends.append(((yield from self.world.isend(buf, dst)), dst))
        self.comm += self.world.now() - start

    def recv(self, src: int) -> Op[tuple[int, torch.Tensor, float]]:
        """(microbatch or STOP, payload, loss slot) of the next message from `src`."""
        buf = self.world.message(self.size, HEADER)
        self.wait += yield from self.world.recv(buf, src)
        microbatch = int(buf[:1].view(torch.int32)[0])
        payload = (
            buf[HEADER:].view(self.shape)
            if self.numerics
            else torch.empty(self.shape, device="meta")
        )
        return microbatch, payload, float(buf[2:4].view(torch.float64)[0])

    def forward(self, microbatch: int) -> Op[None]:
        stage, per_step = self.stage, self.per_step
        if self.rank == 0:  # the first stage feeds, and decides when to stop
            at_step = microbatch % per_step == 0
            done = spent(self.job.cfg.budget, microbatch // per_step, self.world.now())
            if at_step and (done or self.diverged):
                return (yield from self.stop())
            x, y = next(self.stream)
        else:  # x: the previous stage's hidden state
            got, x, _ = yield from self.recv(self.rank - 1)
            if got == STOP:
                return (yield from self.stop())
            if got != microbatch:
                raise RunError(f"stage {self.rank} expected microbatch {microbatch}, got {got}")
            _, y = next(self.stream)
        if stage.version != stage.forward_version(microbatch):
            raise RunError(f"stage {self.rank} holds version {stage.version} at F({microbatch})")
        step = lambda: stage.forward(microbatch, x, stage.version, y)  # noqa: E731
        out, seconds = yield from self.world.compute(step, self.cost["F"])
        self.compute += seconds
        if not stage.last:
            yield from self.send(self.rank + 1, microbatch, out)
        self.issued = microbatch + 1

    def stop(self) -> Op[None]:
        """No more microbatches: tell the next stage, then drain."""
        self.stopped = True
        if not self.stage.last:
            yield from self.send(self.rank + 1, STOP, None)

    def backward(self, microbatch: int) -> Op[None]:
        grad_out, loss = None, float("nan")
        if not self.stage.last:  # the gradient, and the microbatch's loss, from downstream
            got, grad_out, loss = yield from self.recv(self.rank + 1)
            if got != microbatch:
                raise RunError(
                    f"stage {self.rank} expected the gradient of {microbatch}, got {got}"
                )
        step = lambda: self.stage.backward(microbatch, grad_out)  # noqa: E731
        (grad_in, own_loss), seconds = yield from self.world.compute(step, self.cost["B"])
        self.compute += seconds
        self.losses.append(own_loss if self.stage.last else loss)
        if self.rank > 0:
            yield from self.send(self.rank - 1, microbatch, grad_in, self.losses[-1])

    def update(self, clock: int) -> Op[None]:
        """The update of microbatch (1F1B) or step (flush) `clock`."""
        applied, seconds = yield from self.world.compute(self.stage.apply, 0.0)
        loss, self.losses = sum(self.losses) / len(self.losses), []
        t = self.world.now()
        timing = {"compute_s": self.compute + seconds, "wait_s": self.wait, "comm_s": self.comm}
        event = update_event(self.stage, clock, applied, loss, **timing)
        self.world.events.emit("update", t, **event)
        self.compute = self.wait = self.comm = 0.0
        if self.stage.version % self.job.cfg.eval.every_updates == 0:
            self.snapshot(t)
        self.diverged = self.diverged or (self.numerics and not math.isfinite(loss))

    def snapshot(self, t: float) -> None:
        version = self.stage.version
        self.snapshots[version], self.times[version] = self.stage.w.clone(), t


def microbatches(job: Job) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The pipeline's one stream of microbatches: minibatches of dataset.batch_size over the
    whole training split, each cut into algorithm.pipeline.microbatches pieces when the
    schedule flushes (one piece otherwise)."""
    cfg = job.cfg
    parts, data = cfg.algorithm.pipeline.per_step, cfg.dataset
    for x, y in shard_batches(
        job.splits, 0, 1, data.batch_size, cfg.seed, "replicated", shuffle=data.shuffle
    ):
        yield from zip(x.chunk(parts), y.chunk(parts), strict=True)


def build_stages(job: Job) -> tuple[torch.nn.Sequential, list[torch.nn.Sequential], tuple]:
    """The whole model (θ₀ seeded, identical in every process), its stage slices, and the
    shape of what crosses a stage boundary (the first stage's output for a microbatch)."""
    cfg = job.cfg
    model = job.model()
    modules = split(model, cfg.algorithm.pipeline.stages)
    with torch.no_grad():
        ids = job.splits.x_train[: cfg.dataset.batch_size // cfg.algorithm.pipeline.per_step]
        shape = tuple(modules[0](ids.to(job.host)).shape)  # cost-only: on the meta device
    return model, modules, shape


def update_event(stage: Stage, clock: int, applied: Applied, loss: float, **timing: float) -> dict:
    return dict(
        worker=stage.index,
        clock=clock,
        version=applied.version,
        lag=applied.lag,
        loss=loss,
        weight_gap=applied.weight_gap,
        grad_norm=applied.grad_norm,
        **timing,
    )


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

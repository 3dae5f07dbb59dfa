"""The simulator's lazy steps and their batches (`sim.batch`; docs/design.md, "Batched
gradients"): a step a rank took whose result is not needed yet waits (`Deferred`), and
steps of one kind — a model's gradient at different ranks' θ — run together when the
first of them is needed (`Batcher`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from stalebench.runtime.signals import shielded


class Deferred:
    """A lazy step (`World.compute(lazy=True)`), run once, by whoever needs it first: alone,
    or in a batch with other ranks' (`Batcher`) when it has a `batch_key`."""

    __slots__ = ("step", "world", "key", "seq", "result")

    def __init__(self, step: Callable[[], Any], world: Any):  # the rank's SimWorld
        self.step: Callable[[], Any] | None = step
        self.world, self.key, self.seq, self.result = world, None, 0, None

    def run(self) -> None:
        if self.step is None:
            return
        if self.key is not None:
            self.world.sim.batcher.run(self)
            return
        step, self.step = self.step, None
        self.result = step()

    def first(self) -> bool:
        """Whether it is its rank's oldest lazy step not yet run (a rank's run in order)."""
        return next(d for d in self.world.pending if d.step is not None) is self


class Batcher:
    """Steps that can run together: those with a `batch_key` that is not None (e.g. the
    architecture of the model several ranks compute gradients with), run by
    `step.run_batch(steps)`, which returns each one's result and the bytes each held. A
    step waits (lazy, or its rank asleep for its duration, `SimWorld.compute`); when one
    is first needed, it runs with the other ranks' pending steps of its key — each rank's
    oldest, so a rank's own steps keep their order — up to `limit` (`sim.batch_max`), in
    the order they were taken. The steps read only what is fixed once taken, so running
    them sooner than needed changes no result; the history stays the simulator's."""

    def __init__(self, limit: int):
        self.limit = limit
        self.queues: dict[Any, list[Deferred]] = {}
        self.seq = itertools.count()
        self.batches = self.steps = self.largest = 0
        self.start_s = 0.0  # torch.func's one-time start-up, paid before the first batch
        self.step_bytes = 0

    @staticmethod
    def can_batch(step: Any) -> bool:
        """Whether the step has a batch key (None: it runs alone)."""
        return getattr(step, "batch_key", None) is not None

    def add(self, deferred: Deferred) -> None:
        key = getattr(deferred.step, "batch_key", None)
        if key is None:
            return
        deferred.key, deferred.seq = key, next(self.seq)
        if key not in self.queues:
            self.queues[key] = []
            if not self.start_s:
                self.start_s = warm_up()
        self.queues[key].append(deferred)

    def run(self, needed: Deferred) -> None:
        queue, chosen, ranks = self.queues[needed.key], [needed], {needed.world.rank}
        for d in queue:
            if len(chosen) >= self.limit:
                break
            if d.step is not None and d.world.rank not in ranks and d.first():
                chosen.append(d)
                ranks.add(d.world.rank)
        chosen.sort(key=lambda d: d.seq)
        steps = [d.step for d in chosen]
        for d in chosen:
            d.step = None
        # the steps run leave the queue: those at its head now, the others as they reach it
        # (every pass over it skips a step already run)
        first = 0
        while first < len(queue) and queue[first].step is None:
            first += 1
        del queue[:first]
        self.batches, self.steps = self.batches + 1, self.steps + len(steps)
        self.largest = max(self.largest, len(steps))
        with shielded():  # torch.func inside: a signal waits for the batch's end
            results, step_bytes = steps[0].run_batch(steps)
        self.step_bytes = max(self.step_bytes, step_bytes)
        for d, result in zip(chosen, results, strict=True):
            d.result = result

    def report(self) -> dict[str, Any]:
        """summary.json's `sim_batch`: batches run, gradients in them, the mean and largest
        batch, and the bytes each gradient held (θ, gradient, minibatch, buffers)."""
        if not self.batches:
            return {}
        return {"sim_batch": {
            "batches": self.batches, "gradients": self.steps,
            "mean": round(self.steps / self.batches, 2), "largest": self.largest,
            "bytes_per_gradient": self.step_bytes, "start_s": round(self.start_s, 3),
        }}  # fmt: skip


def warm_up() -> float:
    """Pay torch.func's lazy imports (about a second, once per process) with a toy
    gradient; the seconds it took."""
    from torch.func import grad, vmap

    start = time.perf_counter()
    with shielded():  # as a batch's: a signal waits for the transform's end
        vmap(grad(lambda w: (w * w).sum()))(torch.ones(1, 1))
    return time.perf_counter() - start

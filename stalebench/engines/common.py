"""What several engines' programs share, below them all: the model a process computes
gradients with, as one flat vector (`Net`), and its gradient step. No engine imports
another engine's package; what two of them need lives here (what their configs and checks
share, without torch: `parallel`)."""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from stalebench import precision
from stalebench.job import Job
from stalebench.runtime.record import Into, gradient

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled(job: Job, model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What computes `model`'s forward pass: with compile=true, `torch.compile(model)` with
    `compile_backend`, one per module (its compiled code and guards kept across the calls:
    the warm-up step compiles it, every later step reuses it); else the model itself. The
    module keeps its parameters, their names and state_dict as built."""
    if not job.cfg.compile or not job.numerics:
        return model
    if model not in _COMPILED:
        _COMPILED[model] = torch.compile(model, backend=job.cfg.compile_backend)
    return _COMPILED[model]


class Net:
    """The model a process computes gradients with, its parameters views of one flat
    vector (a replica is loaded with one copy). In the simulator, it is also what batches
    the pending gradients of the workers that share it (`run_batch`)."""

    def __init__(
        self,
        job: Job,
        device: torch.device,
        model: torch.nn.Module | None = None,
        flat: torch.Tensor | None = None,
    ):
        """The job's model θ₀ on `device`; or `model`, already built (a replica's own), its
        parameters views of `flat` if given."""
        from stalebench.models.nets import flatten_parameters

        self.model = model if model is not None else job.model().to(device)
        self.flat = flat if flat is not None else flatten_parameters(self.model)
        self.forward = compiled(job, self.model)  # compile=true: compiled, else the model
        self.params = list(self.model.parameters())
        self.buffers = list(self.model.buffers())
        self.device = device
        self.numerics = job.numerics  # false: a cost-only run's steps compute nothing
        self.batchable = self.numerics and batchable(job, self.model, self.flat.numel(), device)
        # nets of one architecture on one device batch together (a run builds its models
        # from one config: the module tree's repr tells them apart)
        self.signature = (repr(self.model), str(device)) if self.batchable else None
        self._vmapped: Any = None

    def gradient_at(
        self,
        x: torch.Tensor,
        buffers: list[torch.Tensor],
        batch,
        out: torch.Tensor | Into | None = None,
        scale: precision.LossScale | None = None,
    ) -> tuple[torch.Tensor, float]:
        """The gradient (into `out`, if given) and loss of `batch` at θ = x, with the
        BatchNorm statistics `buffers` (the caller's own, left as the forward pass updated
        them) and under precision=fp16 the caller's loss `scale`. A cost-only run's gradient
        is `out` as it was, its loss NaN: nothing is computed (`sim.numerics=false`)."""
        if not self.numerics:
            return (out.flat if isinstance(out, Into) else out), math.nan
        if x is not self.flat:  # a replica computing at its own θ needs no copy
            self.flat.copy_(x, non_blocking=True)  # from a pinned mailbox: queued
        if not buffers:  # no BatchNorm
            return gradient(self.forward, self.params, batch, self.device, out, scale)
        for mine, shared in zip(buffers, self.buffers, strict=True):
            shared.copy_(mine)
        grad = gradient(self.forward, self.params, batch, self.device, out, scale, self.buffers)
        for mine, shared in zip(buffers, self.buffers, strict=True):
            mine.copy_(shared)
        return grad

    def run_batch(self, steps: list[GradientStep]) -> tuple[list[Any], int]:
        """The steps' gradients together (this net's model the template of theirs): one
        vmapped forward and backward over their parameter versions and minibatches (each
        drawn now, in the steps' order), each into its step's `out`, then each step's
        `then`, in order; what each `then` returned, and the bytes each gradient held (θ,
        gradient, minibatch, BatchNorm buffers). Minibatches of unequal sizes (a barrier
        that re-assigns them) run as one batch per size."""
        from stalebench.data.sharding import stacked

        taken = [(s.batches, s.batches.take()) for s in steps]
        by_size: dict[int, list[int]] = {}
        for k, (_, idx) in enumerate(taken):
            by_size.setdefault(len(idx), []).append(k)
        results: list[Any] = [None] * len(steps)
        dev, step_bytes = self.device, 0
        for ks in by_size.values():
            xs, ys = stacked([taken[k] for k in ks])
            thetas = torch.stack([steps[k].at for k in ks]).to(dev)
            bufs = [torch.stack([steps[k].buffers[i] for k in ks]).to(dev)
                    for i in range(len(self.buffers))]  # fmt: skip
            scales = [steps[k].scale for k in ks]
            factors = torch.stack([s.scale if s else torch.ones((), device=dev) for s in scales])
            grads, losses = self.vmapped()(thetas, bufs, xs.to(dev), ys.to(dev), factors)
            losses = losses / factors  # of the scaled losses (fp16), the losses
            # fp16: each unscaled; one that overflowed is computed again alone at the scale
            # backed off (its statistics as they were), as one gradient at a time would be
            again = [s is not None and not s.unscaled([g]) and s.again(loss)
                     for s, g, loss in zip(scales, grads, losses, strict=True)]  # fmt: skip
            grads = grads.cpu()  # from a GPU: one copy for the batch, not one per step
            each = thetas[0].nbytes * 2 + xs[0].nbytes + ys[0].nbytes
            step_bytes = max(step_bytes, each + sum(b[0].nbytes for b in bufs))
            for j, (k, loss) in enumerate(zip(ks, losses.tolist(), strict=True)):
                if again[j]:
                    step = steps[k]
                    results[k] = step.net.gradient_at(step.at, step.buffers, (xs[j], ys[j]),
                                                      None, step.scale)  # fmt: skip
                    continue
                results[k] = (grads[j], loss)
                for mine, stacked_buf in zip(steps[k].buffers, bufs, strict=True):
                    mine.copy_(stacked_buf[j])  # the forward pass's BatchNorm statistics
        done = []
        for step, (grad, loss) in zip(steps, results, strict=True):
            out = step.out.copy_(grad) if step.out is not None else grad.clone()
            done.append(step.then(out, loss))
        return done, step_bytes

    def vmapped(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """(θs, BatchNorm buffers, xs, ys, loss scales) → (gradients, losses), of the
        losses times the scales (fp16's loss scaling; else ones), one per leading index."""
        if self._vmapped is None:
            from torch.func import functional_call, grad_and_value, vmap

            from stalebench.evaluation import objective

            model = self.model
            names = [name for name, _ in model.named_parameters()]
            shapes = [p.shape for p in self.params]
            sizes = [p.numel() for p in self.params]
            buffer_names = [name for name, _ in model.named_buffers()]

            def loss(theta, buffers, x, y, factor):
                views = (t.view(s) for t, s in zip(theta.split(sizes), shapes, strict=True))
                params = dict(zip(names, views, strict=True))
                named = dict(zip(buffer_names, buffers, strict=True))
                # as one gradient at a time computes it (BatchNorm's mixed dtypes, which
                # vmap's batch_norm refuses, made float32 for it)
                with precision.autocast(x.device), precision.norms_in_float32(model):
                    out = functional_call(model, (params, named), (x,))
                    return objective(out, y) * factor

            self._vmapped = vmap(grad_and_value(loss))
        return self._vmapped


def late_loss(record, world, rank: int, lost, t_end: float) -> None:
    """A worker's loss heard only after the run ended at `t_end`: the run's loss, recorded
    at its end, when the worker (`rank`) died before it (`World.died_at`: a death in the
    run's last moments is heard once its process is gone); else only logged."""
    died = world.died_at(rank)
    if died is None or died > t_end:
        logging.getLogger("stalebench").warning("server: after the end, %s", lost)
        return
    reason = (f"worker {lost.worker} died at {died:.3f} s (a fault injected by cluster.faults), "
              "heard after the run's end")  # fmt: skip
    record.events.emit("worker", t_end, worker=lost.worker, event="lost", reason=reason)


def catch_up(profile, worker: int, batches, steps: int) -> None:
    """A worker that starts at its step `steps` (a resumed run's, or a spare in a lost
    worker's place): its minibatches and step times go on from there. The minibatches are
    drawn with `next` (not `take`), so that their augmentation stream moves on too."""
    for _ in range(steps):
        next(batches)
    while profile.steps[worker] < steps:
        profile.step_s(worker)


def batchable(job: Job, model: torch.nn.Module, d: int, device: torch.device) -> bool:
    """Whether the simulator batches this model's gradients (`sim.batch`): never a model
    that draws random numbers in its forward pass (dropout: a batch would draw them in
    another order); under `auto`, any model on CUDA, and on the CPU a model of at most
    `sim.batch_max_params` parameters without 2-D convolutions (vmapped, a Conv2d is a
    grouped convolution, whose backward on the CPU is slower than one model at a time:
    ResNet-20 at 32 workers, 5x slower; Conv1d layers gain)."""
    cfg = job.cfg.sim
    modules = list(model.modules())
    if cfg.batch == "off" or any(
        isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in modules
    ):
        return False
    if cfg.batch == "on" or device.type == "cuda":
        return True
    return d <= cfg.batch_max_params and not any(isinstance(m, torch.nn.Conv2d) for m in modules)


class GradientStep:
    """A worker's gradient as a step (`World.compute`): of `net` at θ = `at`, on the next
    minibatch of `batches` (a `Minibatches`), with the worker's BatchNorm statistics
    `buffers` and loss scale `scale` (precision=fp16; else None), into `out` (None: a new
    CPU tensor), then `then(gradient, loss)`, whose result is the step's. Called, it is
    one gradient; the simulator may instead run it in a batch (`run_batch`) with the other
    workers' pending steps of the same `batch_key` (nets of one architecture): its inputs
    are the worker's own, fixed once the step is taken, so it reads the same whenever it
    runs."""

    __slots__ = ("net", "at", "buffers", "batches", "out", "then", "into", "batch_key", "scale")

    def __init__(
        self,
        net: Net,
        at: torch.Tensor,
        buffers: list[torch.Tensor],
        batches: Iterator,
        out: torch.Tensor | None,
        then: Callable[[torch.Tensor, float], Any],
        scale: precision.LossScale | None = None,
    ):
        self.net, self.at, self.buffers, self.batches = net, at, buffers, batches
        self.out, self.then, self.scale = out, then, scale
        cpu = out is not None and net.device.type == "cpu"
        self.into = Into(out, net.params) if cpu else out  # written without a concatenation
        self.batch_key = net.signature

    def run_batch(self, steps: list[GradientStep]) -> tuple[list[Any], int]:
        return self.net.run_batch(steps)

    def __call__(self) -> Any:
        if not self.net.numerics:  # cost-only: no minibatch drawn, nothing computed
            return self.then(*self.net.gradient_at(self.at, self.buffers, None, self.into))
        batch = next(self.batches)
        grad, loss = self.net.gradient_at(self.at, self.buffers, batch, self.into, self.scale)
        return self.then(grad, loss)

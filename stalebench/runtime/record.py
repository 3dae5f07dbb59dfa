"""The run record every engine writes the same way (events, θ snapshots, the final files),
the budget and divergence tests, and a worker's gradient step."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import vector_to_parameters

from stalebench import precision
from stalebench.config import BudgetConfig
from stalebench.errors import RunError
from stalebench.evaluation import SPILL, Snapshots, Spill, evaluate_snapshots, objective
from stalebench.job import Job
from stalebench.metrics.events import EventLog
from stalebench.metrics.summary import finalize, hold_room, load_writers
from stalebench.models.nets import flatten_parameters, param_views  # noqa: F401  (re-exported)
from stalebench.runtime import checkpoint
from stalebench.runtime.checkpoint import Checkpoints
from stalebench.runtime.faults import WorkerLost


class RunRecord:
    """The run directory being written: events, θ snapshots, and the final files."""

    def __init__(
        self, job: Job, run_dir: Path, flush_s: float = 0.0, resume: dict[str, Any] | None = None,
        keep_events: bool = False,
    ):  # fmt: skip
        """`keep_events`: this record's log is its events.jsonl's only writer (the
        simulator's), whose events the run's end takes as written, not read back."""
        self.job, self.run_dir = job, Path(run_dir)
        self.resumed = resume  # the checkpoint this run goes on from, if any
        # set by the simulator: `t` is virtual (the end event says so), and its own real
        # time goes to summary.json only
        self.virtual_time = False
        self.timing: Callable[[], dict[str, Any]] = dict
        self.ranks: list[dict[str, Any]] | None = None  # each rank's host and device, once known
        hold_room(self.run_dir)  # for summary.json, should the disk fill up
        load_writers()  # a signal while the run ends must not land in their first import
        # a cost-only run's events without what needs values (the losses), whatever emits them
        self.events = EventLog(self.run_dir / "events.jsonl", flush_s, values=job.numerics,
                               keep=keep_events and not resume)  # fmt: skip
        self.snapshots = Snapshots(job.cfg.eval, on_grid=job.cfg.runtime == "sim",
                                   spill=Spill(self.run_dir / SPILL))  # fmt: skip
        self.checkpoints = Checkpoints(
            self.run_dir, self.events, self.snapshots, job.meta["config_sha"]
        )
        if resume:  # the checkpoint this run goes on from (events.jsonl rewound to it)
            self.checkpoints.resume(resume)
            self.events.emit("system", resume["t"], event="resume", version=resume["version"])
            return
        # the host's load and the config's fingerprint go to summary.json only: events stay
        # a function of config and seed (byte-identical in the sim runtime)
        labels = {k: v for k, v in job.meta.items()
                  if k not in ("host", "config_sha", "arithmetic", "step_time")}  # fmt: skip
        self.events.emit("system", 0.0, event="start", **job.sharding_fields, **labels)

    def worker_lost(self, t: float, lost: WorkerLost, gone: int) -> None:
        """Record a worker the run goes on without (`gone`: how many it has lost, this one
        included); losing the last one ends the run."""
        self.events.emit("worker", t, worker=lost.worker, event="lost", reason=str(lost))
        if gone == self.job.num_workers:
            raise RunError(f"every worker is lost (the last: {lost})")

    def finish(
        self,
        model: torch.nn.Module,
        params: torch.Tensor,
        version: int,
        t_end: float,
        status: str,
        error: str | None,
        summary_extra: dict[str, Any] | None = None,
        **end_fields: Any,
    ) -> dict[str, Any]:
        """Final snapshot, the end event (with `end_fields`), the evaluations (off the clock),
        model.pt, and summary.json / metrics.parquet (with `summary_extra`: measurements that
        must not enter the events, such as the simulator's own real time). A cost-only run
        has no θ to evaluate or save: its end event and summary.json, nothing else."""
        cfg, timing = self.job.cfg, self.timing()
        if not self.job.numerics:
            self._end(t_end, version, status, error, **end_fields)
            return self._close(status, error, {**(summary_extra or {}), **timing})
        self.snapshots.take(t_end, version, params)
        held_out: list[float | None] = []  # the held-out split's loss at each snapshot

        def emit(kind: str, t: float, **fields: Any) -> None:
            if kind == "eval" and fields.get("split") != "train":
                held_out.append(fields.get("loss"))
            self.events.emit(kind, t, **fields)

        evaluate_snapshots(
            self.snapshots.taken, model, self.job.splits, cfg.eval, cfg.seed, emit,
            self.job.device(0),
        )  # fmt: skip
        if status == "completed" and (why := blown_up(held_out, cfg.budget.diverge_factor)):
            status, error = "diverged", why
        self._end(t_end, version, status, error, **end_fields)
        vector_to_parameters(params, model.parameters())
        checkpoint.write(model.state_dict(), self.run_dir / "model.pt")
        chance = chance_accuracy(self.job.splits)
        extra = {"chance_accuracy": chance, **(summary_extra or {}), **timing}
        return self._close(status, error, extra)

    def fail(self, t_end: float, version: int, error: str) -> dict[str, Any]:
        """End a failed run that cannot be evaluated (a peer holding part of θ is gone): the
        error and end events, then summary.json and metrics.parquet."""
        self._end(t_end, version, "failed", error)
        return self._close("failed", error)

    def _end(self, t_end: float, version: int, status: str, error: str | None, **fields) -> None:
        if error:
            self.events.emit("system", t_end, event="error", error=error)
        if self.virtual_time:
            fields["virtual_time"] = True
        self.events.emit("system", t_end, event="end", status=status, updates=version, **fields)

    def _close(self, status: str, error: str | None, summary_extra=None) -> dict[str, Any]:
        cfg = self.job.cfg
        self.events.close()
        if self.snapshots.spill is not None:
            self.snapshots.spill.close()  # evaluated, or never to be
        extra = {**self.job.sharding_fields, **(summary_extra or {})}
        if self.ranks is not None:  # each rank's host and device (`World.placed`)
            extra["ranks"] = self.ranks
        return finalize(
            self.run_dir, self.job.meta, status, error, cfg.budget.target_accuracy, extra,
            events=self.events.kept,
        )  # fmt: skip


def spent(budget: BudgetConfig, version: int, t: float) -> bool:
    return bool(
        (budget.max_updates and version >= budget.max_updates)
        or (budget.max_wall_s and t >= budget.max_wall_s)
    )


def blown_up(losses: list[float | None], factor: float) -> str | None:
    """Why a run that trained to its end diverged, as the papers mean it: its held-out loss
    ends non-finite (an overflow: JSON null) or above `factor` × its loss at θ₀ (factor 0:
    only non-finite); None when it did not."""
    if not losses:
        return None
    first, last = losses[0], losses[-1]
    if last is None or not math.isfinite(last):
        return f"the held-out loss ends at {last} (overflow)"
    if factor and first is not None and math.isfinite(first) and last > factor * first:
        return (
            f"the held-out loss ends at {last:.4g}, above budget.diverge_factor={factor:g} × "
            f"its initial {first:.4g}"
        )
    return None


def chance_accuracy(splits) -> float | None:
    """The accuracy of always answering the held-out split's most frequent class (or
    token): what a model that learned nothing scores; None for regression."""
    _, _, y = splits.held_out
    if splits.regression or not len(y):
        return None
    return float(torch.bincount(y.reshape(-1)).max()) / y.numel()


def diverged(loss: float, params: torch.Tensor | None = None) -> bool:
    """A non-finite training loss, or (when given) non-finite parameters."""
    if not math.isfinite(loss):
        return True
    return params is not None and not bool(torch.isfinite(params).all())


class Into:
    """A flat CPU buffer that gradients are written into (a message's payload), with its
    views shaped as the model's parameters: a gradient goes in by one copy of the pieces,
    not a concatenation (`gradient`)."""

    __slots__ = ("flat", "views")

    def __init__(self, flat: torch.Tensor, params: list[torch.Tensor]):
        self.flat, self.views = flat, param_views(flat, params)


def gradient(
    model: torch.nn.Module,
    params: list[torch.Tensor],
    batch,
    device: torch.device,
    out: torch.Tensor | Into | None = None,
    scale: precision.LossScale | None = None,
    buffers: Sequence[torch.Tensor] = (),
) -> tuple[torch.Tensor, float]:
    """Flat CPU gradient of the mean `objective` on one minibatch (cross-entropy for labels,
    ½·mean squared error for float targets), and the loss; written into `out` if given (a
    message's payload: no copy of its own; an `Into` on the CPU). From a GPU the copy into
    `out` is queued (`non_blocking`: asynchronous into pinned memory) and complete once
    the loss is read, which waits for the device's stream. `scale`: the worker's loss scale
    under precision=fp16 (`model`'s BatchNorm statistics `buffers` kept for a gradient
    computed again after an overflow)."""
    x, y = batch
    if device.type != "cpu":  # the data is on the CPU
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def loss_of() -> torch.Tensor:
        with precision.autocast(device):  # bf16, fp16: the forward pass in half precision
            return objective(model(x), y)

    grads, loss = precision.grads_of(loss_of, params, scale, buffers)
    if isinstance(out, Into):
        torch._foreach_copy_(out.views, grads, non_blocking=True)  # torch.optim's foreach copy
        return out.flat, loss.item()
    flat = [g.reshape(-1) for g in grads]
    if out is None:
        return torch.cat(flat).cpu(), loss.item()
    if device.type == "cpu":
        return torch.cat(flat, out=out), loss.item()
    return out.copy_(torch.cat(flat), non_blocking=True), loss.item()

"""What both runtimes of the pipeline engine share: the one stream of microbatches, the
model and its stage slices, and the events and summary fields a pipeline writes. The
simulator is `sim.py`, the processes are `real.py`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from stalebench.config import RunConfig
from stalebench.data import shard_batches
from stalebench.engines.pipeline.stage import Applied, Stage, split
from stalebench.job import Job

HEADER = 8  # float32 slots before a message's payload: the microbatch (int32), the loss

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

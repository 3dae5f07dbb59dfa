"""compose → validate → build components → run in a runtime → summary.

Everything a process needs to take part in a run is rebuilt from the RunConfig, so every
process (spawned, or started by torchrun) agrees on model, data and algorithm without
shipping objects between processes. The engine chosen by `engine=<name>` says what each
process does; this module only asks it through its hooks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stalebench import plugins
from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.algorithms.local import INNER, OUTER
from stalebench.cluster import Profile
from stalebench.config import ENGINES, RunConfig
from stalebench.data import DATASETS
from stalebench.engines.base import Engine
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.metrics.summary import stop
from stalebench.models import MODELS
from stalebench.runtime.signals import Interrupted, interruptible


def engine_of(cfg: RunConfig) -> Engine:
    """The engine `cfg.engine` names, built for this run."""
    plugins.load()
    return ENGINES.build(cfg.engine, cfg)


def check_device(cfg: RunConfig) -> None:
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but CUDA is not available here (use device=auto)")


def prepare(cfg: RunConfig) -> Engine:
    """Everything that can be wrong with the input, checked before any process starts;
    returns the run's engine."""
    engine = engine_of(cfg)
    a = cfg.algorithm
    parts = ((BARRIERS, a.barrier), (UPDATES, a.update), (INNER, a.inner), (OUTER, a.outer))
    for registry, part in parts:
        if part is not None:
            registry.get(part.name)
    MODELS.get(cfg.model.name)
    Profile(cfg.cluster, cfg.seed)  # a trace file is read (and refused) here, not per process
    dataset = DATASETS.build(cfg.dataset)
    dataset.prepare()
    splits = dataset.load()
    engine.validate(splits)
    # a model that cannot take the dataset's inputs fails here, not inside every process
    MODELS.build(cfg.model, splits.input_shape, splits.num_classes)
    check_device(cfg)
    return engine


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run one configured job to its end and return its summary (also in summary.json)."""
    return launch(cfg, prepare(cfg))


def launch(cfg: RunConfig, engine: Engine | None = None) -> dict[str, Any]:
    """Run a prepared job in its runtime."""
    engine = engine or engine_of(cfg)
    if not cfg.run_dir:
        raise ConfigError("run_dir is empty: the CLI sets it from Hydra's output directory")
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    if cfg.runtime == "sim":
        job = Job.build(cfg, engine.num_workers, engine.one_stream)
        try:
            with interruptible():
                return engine.simulate(job, Path(cfg.run_dir))
        except Interrupted as exc:
            stop(Path(cfg.run_dir), job.meta, "interrupted", str(exc), cfg.budget.target_accuracy)
            raise
    from stalebench.runtime import launch as real

    return real.launch(cfg, engine, plugins.load)

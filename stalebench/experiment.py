"""compose → validate → build components → run in a runtime → summary.

Everything a process needs to take part in a run is rebuilt here from the RunConfig, so
the server and every worker (spawned, or started by torchrun) agree on model, data and
algorithm without shipping objects between processes.
"""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.cluster import Profile
from stalebench.config import RunConfig
from stalebench.data import DATASETS, Splits, resolve_sharding, shard_batches
from stalebench.errors import ConfigError
from stalebench.models import MODELS

if TYPE_CHECKING:
    import torch
    from torch import nn


def meta(cfg: RunConfig) -> dict[str, Any]:
    """The run's identity, as summary.json reports it."""
    barrier, update = cfg.algorithm.parts  # in a pipeline: the schedule and the optimizer
    return {
        "algorithm": cfg.algorithm.label,
        "barrier": barrier,
        "update_rule": update,
        "engine": cfg.engine,
        "runtime": cfg.runtime,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "cluster": cfg.cluster.preset,
        "num_workers": num_workers(cfg),
        "seed": cfg.seed,
        "host": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg": list(os.getloadavg()),
        },
    }


def num_workers(cfg: RunConfig) -> int:
    """Processes that compute: the workers, or a pipeline's stages."""
    return cfg.algorithm.pipeline.stages if cfg.engine == "pipeline" else cfg.cluster.num_workers


# cluster settings a pipeline run does not model yet: refused rather than silently ignored
PIPELINE_UNMODELLED = (
    "slowdown",
    "slow_fraction",
    "straggler_prob",
    "push_latency_ms",
    "pull_latency_ms",
    "push_bandwidth_gbps",
    "pull_bandwidth_gbps",
    "faults",
    "trace_file",
)


def check_device(cfg: RunConfig) -> None:
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device=cuda but CUDA is not available here (use device=auto)")


def prepare(cfg: RunConfig) -> None:
    """Everything that can be wrong with the input, checked before any process starts."""
    if cfg.engine == "pipeline":
        return prepare_pipeline(cfg)
    for registry, part in (
        (BARRIERS, cfg.algorithm.barrier),
        (UPDATES, cfg.algorithm.update),
        (MODELS, cfg.model),
        (DATASETS, cfg.dataset),
    ):
        registry.get(part.name)
    rule_cls, _ = UPDATES.get(cfg.algorithm.update.name)
    if cfg.algorithm.barrier.apply == "per_round" and rule_cls.per_worker:
        raise ConfigError(
            f"algorithm.update={cfg.algorithm.update.name} keeps per-worker state and cannot "
            "take a round's averaged gradient (algorithm.barrier.apply=per_round); use a "
            "barrier that applies per arrival"
        )
    if cfg.engine == "allreduce" and not BARRIERS.get(cfg.algorithm.barrier.name)[0].synchronous:
        sync = [n for n in BARRIERS.names() if BARRIERS.get(n)[0].synchronous]
        raise ConfigError(
            f"engine=allreduce is synchronous: algorithm.barrier must be one of "
            f"{', '.join(sync)}, got {cfg.algorithm.barrier.name!r}"
        )
    if cfg.runtime == "sim" and cfg.cluster.compute_ms <= 0:
        raise ConfigError(
            "runtime=sim needs a step time: set cluster.compute_ms > 0 (virtual ms per step)"
        )
    check_device(cfg)
    dataset = DATASETS.build(cfg.dataset)
    dataset.prepare()
    splits = dataset.load()
    # a model that cannot take the dataset's inputs fails here, not inside every process
    MODELS.build(cfg.model, splits.input_shape, splits.num_classes)
    n_train = len(splits.y_train)
    smallest_shard = n_train // cfg.cluster.num_workers
    if n_train < cfg.dataset.batch_size:
        raise ConfigError(
            f"dataset.batch_size={cfg.dataset.batch_size} exceeds the {n_train} training samples"
        )
    if cfg.dataset.sharding == "disjoint" and smallest_shard < cfg.dataset.batch_size:
        raise ConfigError(
            f"dataset.batch_size={cfg.dataset.batch_size} exceeds a worker's shard of "
            f"{smallest_shard} samples ({n_train} training samples over "
            f"cluster.num_workers={cfg.cluster.num_workers}); dataset.sharding=replicated "
            f"lets every worker sample the whole split"
        )


def prepare_pipeline(cfg: RunConfig) -> None:
    from stalebench.algorithms.pipeline import OPTIMIZERS

    OPTIMIZERS.get(cfg.algorithm.optimizer.name)
    MODELS.get(cfg.model.name)
    DATASETS.get(cfg.dataset.name)
    pipe = cfg.algorithm.pipeline
    for key in PIPELINE_UNMODELLED:
        value = getattr(cfg.cluster, key)
        if value:
            raise ConfigError(
                f"cluster.{key}={value}: engine=pipeline does not model this yet (it uses "
                "only cluster.compute_ms, the sim's stage time per microbatch); use "
                "cluster=homogeneous"
            )
    if pipe.flush and cfg.dataset.batch_size % pipe.microbatches:
        raise ConfigError(
            f"dataset.batch_size={cfg.dataset.batch_size} must be a multiple of "
            f"algorithm.pipeline.microbatches={pipe.microbatches}"
        )
    if cfg.eval.every_updates < 1:
        raise ConfigError(
            f"eval.every_updates={cfg.eval.every_updates}: engine=pipeline snapshots every stage "
            "at the same step, so it needs eval.every_updates >= 1 (eval.every_s is not used)"
        )
    if cfg.runtime == "sim" and cfg.cluster.compute_ms <= 0:
        raise ConfigError("runtime=sim needs cluster.compute_ms > 0 (virtual ms per microbatch)")
    dataset = DATASETS.build(cfg.dataset)
    dataset.prepare()
    splits = dataset.load()
    if splits.x_train.is_floating_point() or splits.x_train.dim() != 2:
        raise ConfigError(
            f"engine=pipeline trains a language model: dataset={cfg.dataset.name} gives "
            f"inputs of shape {tuple(splits.x_train.shape[1:])}, not token sequences"
        )
    if len(splits.y_train) < cfg.dataset.batch_size:
        raise ConfigError(
            f"dataset.batch_size={cfg.dataset.batch_size} exceeds the "
            f"{len(splits.y_train)} training sequences"
        )
    from stalebench.engines.pipeline import split
    from stalebench.models.nets import Stackable

    model = MODELS.build(cfg.model, splits.input_shape, splits.num_classes)
    if not isinstance(model, Stackable):
        raise ConfigError(
            f"engine=pipeline cuts a model into [embedding, blocks..., head] stages; "
            f"model={cfg.model.name} is not built that way (use model=transformer)"
        )
    split(model, pipe.stages)
    check_device(cfg)


@dataclasses.dataclass
class Job:
    """The pieces every process of a run builds identically from the config."""

    cfg: RunConfig
    splits: Splits
    profile: Profile

    @classmethod
    def build(cls, cfg: RunConfig) -> Job:
        return cls(cfg, DATASETS.build(cfg.dataset).load(), Profile(cfg.cluster, cfg.seed))

    @property
    def sharding(self) -> str:
        c = self.cfg
        if c.engine == "pipeline":
            return "replicated"  # one stream of microbatches, over the whole split
        return resolve_sharding(
            c.dataset.sharding,
            len(self.splits.y_train),
            c.cluster.num_workers,
            c.dataset.batch_size,
        )

    def batches(self, worker: int):
        """The endless minibatch stream of one worker."""
        c = self.cfg
        return shard_batches(
            self.splits, worker, c.cluster.num_workers, c.dataset.batch_size, c.seed, self.sharding
        )

    def model(self) -> nn.Module:
        """The model with its seeded initial parameters θ₀ (the same in every process)."""
        import torch

        torch.manual_seed(self.cfg.seed)
        return MODELS.build(self.cfg.model, self.splits.input_shape, self.splits.num_classes)

    def device(self, worker: int) -> torch.device:
        import torch

        if self.cfg.device != "cpu" and torch.cuda.is_available():
            return torch.device("cuda", worker % torch.cuda.device_count())
        return torch.device("cpu")


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run one configured job to its end and return its summary (also in summary.json)."""
    prepare(cfg)
    return launch(cfg)


def launch(cfg: RunConfig) -> dict[str, Any]:
    """Run a prepared job in its runtime."""
    if not cfg.run_dir:
        raise ConfigError("run_dir is empty: the CLI sets it from Hydra's output directory")
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    if cfg.runtime == "sim" and cfg.engine == "pipeline":
        from stalebench.runtime import pipeline

        return pipeline.simulate(cfg)
    if cfg.runtime == "sim":
        from stalebench.runtime import sim

        # what the engine's communication costs: a server's messages, or a round's all-reduce
        network = sim.RingAllReduce.build if cfg.engine == "allreduce" else sim.PointToPoint.build
        return sim.launch(cfg, network)
    from stalebench.runtime import real

    return real.launch(cfg)

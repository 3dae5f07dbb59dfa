"""What several engines share, below them all: the data-parallel engines' validation
(`DataParallel`) and the model a process computes gradients with, as one flat vector
(`Net`). No engine imports another engine's package; what two of them need lives here."""

from __future__ import annotations

import torch

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.engines.base import Engine
from stalebench.errors import ConfigError
from stalebench.job import Job
from stalebench.runtime.record import gradient


class DataParallel(Engine):
    """What the data-parallel engines share: N workers, each on its shard, computing the
    model's gradient; the barrier and the update rule of `algorithm` decide the rest."""

    def validate(self, splits) -> None:
        super().validate(splits)
        a = self.run.algorithm
        barrier_cls, _ = BARRIERS.get(a.barrier.name)
        if a.barrier.on_loss == "reform" and not barrier_cls.reformable:
            able = BARRIERS.names_with("reformable")
            raise ConfigError(
                f"algorithm.barrier.on_loss=reform: barrier {a.barrier.name} decides from more "
                f"than the slowest clock and cannot be re-formed over the survivors; "
                f"{', '.join(able)} can"
            )
        backups, n = getattr(a.barrier, "backups", 0), self.num_workers
        if backups >= n:
            raise ConfigError(
                f"algorithm.barrier.backups={backups} with cluster.num_workers={n}: a round "
                f"needs at least one gradient (backups <= {n - 1})"
            )
        self.check_rebalance(splits)
        rule_cls, _ = UPDATES.get(a.update.name)
        if a.barrier.apply == "per_round" and rule_cls.per_worker:
            raise ConfigError(
                f"algorithm.update={a.update.name} keeps per-worker state and cannot take a "
                "round's averaged gradient (algorithm.barrier.apply=per_round); use a barrier "
                "that applies per arrival"
            )
        self.check_shards(splits)

    def check_rebalance(self, splits) -> None:
        """DBS may give one worker nearly the whole global batch: its shard must hold it."""
        from stalebench.data import resolve_sharding

        every = getattr(self.run.algorithm.barrier, "rebalance_every", 0)
        d, n, n_train = self.run.dataset, self.num_workers, len(splits.y_train)
        sharding = resolve_sharding(d.sharding, n_train, n, d.batch_size)
        if every and sharding != "replicated" and n_train // n < n * d.batch_size:
            raise ConfigError(
                f"algorithm.barrier.rebalance_every={every} may give a worker up to the global "
                f"batch of {n * d.batch_size} samples, more than its shard of about "
                f"{n_train // n} (dataset.sharding={d.sharding}): use dataset.sharding="
                "replicated, or fewer workers"
            )


class Net:
    """The model a process computes gradients with, its parameters views of one flat
    vector (a replica is loaded with one copy)."""

    def __init__(self, job: Job, device: torch.device):
        from stalebench.models.nets import flatten_parameters

        self.model = job.model().to(device)
        self.flat = flatten_parameters(self.model)
        self.params = list(self.model.parameters())
        self.buffers = list(self.model.buffers())
        self.device = device

    def gradient_at(
        self, x: torch.Tensor, buffers: list[torch.Tensor], batch, out: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, float]:
        """The gradient (into `out`, if given) and loss of `batch` at θ = x, with the
        BatchNorm statistics `buffers` (the caller's own, left as the forward pass updated
        them)."""
        self.flat.copy_(x)
        if not buffers:  # no BatchNorm
            return gradient(self.model, self.params, batch, self.device, out)
        for mine, shared in zip(buffers, self.buffers, strict=True):
            shared.copy_(mine)
        grad = gradient(self.model, self.params, batch, self.device, out)
        for mine, shared in zip(buffers, self.buffers, strict=True):
            mine.copy_(shared)
        return grad

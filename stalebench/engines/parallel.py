"""What the data-parallel engines' configs and checks share, without torch (so that the
engines register, and a config is checked, before torch is imported)."""

from __future__ import annotations

from stalebench.algorithms.base import BARRIERS, UPDATES
from stalebench.engines.base import Engine
from stalebench.errors import ConfigError


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

"""What the data-parallel engines' configs and checks share, without torch (so that the
engines register, and a config is checked, before torch is imported)."""

from __future__ import annotations

from stalebench.engines.base import Engine
from stalebench.errors import ConfigError


class DataParallel(Engine):
    """What the data-parallel engines share: N workers, each on its shard, computing the
    model's gradient; the barrier and the update rule of `algorithm` decide the rest."""

    def validate(self, splits) -> None:
        super().validate(splits)
        self.check_rebalance(splits)
        self.check_shards(splits)

    def check_rebalance(self, splits) -> None:
        """Batch sizes re-assigned by speed (a part that needs `batch_sizes`, as DBS) may give
        one worker nearly the whole global batch: its shard must hold it."""
        from stalebench.data import resolve_sharding

        why = self.needed("batch_sizes")
        d, n, n_train = self.run.dataset, self.num_workers, len(splits.y_train)
        sharding = resolve_sharding(d.sharding, n_train, n, d.batch_size)
        if why and sharding != "replicated" and n_train // n < n * d.batch_size:
            raise ConfigError(
                f"{why} may give a worker up to the global batch of {n * d.batch_size} samples, "
                f"more than its shard of about {n_train // n} (dataset.sharding={d.sharding}): "
                "use dataset.sharding=replicated, or fewer workers"
            )

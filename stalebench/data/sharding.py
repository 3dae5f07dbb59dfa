"""Each worker's minibatches: the training split cut into seeded shards (or replicated), and
the choice between the two."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from stalebench.data.base import Splits
from stalebench.errors import ConfigError, RunError

if TYPE_CHECKING:
    import torch


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> torch.Tensor:
    """The seeded order that splits the training set into shards (computed once per run,
    not once per worker: a simulator with 1,000 workers builds 1,000 shards)."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def dirichlet_shards(
    labels: torch.Tensor, num_workers: int, alpha: float, seed: int
) -> list[torch.Tensor]:
    """Label-skewed shards (Hsu et al. 2019): the samples of each class, in the run's seeded
    order, cut among the workers in proportions p_c ~ Dirichlet(α·1) drawn per class from
    the seed. Every sample goes to exactly one worker."""
    import numpy as np
    import torch

    if labels.is_floating_point() or labels.dim() != 1:
        raise ConfigError(
            "dataset.sharding=dirichlet splits by class label: the dataset's targets are "
            f"{'floats' if labels.is_floating_point() else 'sequences'}, not one label per sample"
        )
    order = _permutation(len(labels), seed)
    ordered = labels[order]
    rng = np.random.default_rng([seed, 0xD1])
    parts: list[list[torch.Tensor]] = [[] for _ in range(num_workers)]
    for c in torch.unique(ordered).tolist():
        members = order[ordered == c]
        p = rng.dirichlet(np.full(num_workers, alpha))
        cuts = (np.cumsum(p)[:-1] * len(members)).round().astype(int).tolist()
        for w, piece in enumerate(np.split(np.arange(len(members)), cuts)):
            parts[w].append(members[torch.from_numpy(piece)])
    return [torch.cat(p) for p in parts]


def resolve_sharding(mode: str, num_train: int, num_workers: int, batch_size: int) -> str:
    """auto: disjoint shards when each holds a minibatch, else every worker samples the whole
    training split (the DANA/GA simulators' single data stream, §1.4, for many workers)."""
    if mode != "auto":
        return mode
    return "disjoint" if num_train // num_workers >= batch_size else "replicated"


def shard_batches(
    splits: Splits,
    worker: int,
    num_workers: int,
    batch_size: int,
    seed: int,
    sharding: str = "disjoint",
    dirichlet_alpha: float = 1.0,
) -> Minibatches:
    """Endless minibatches for one worker: a seeded disjoint shard of the training split
    (`replicated`: the whole split; `dirichlet`: its label-skewed shard), reshuffled every
    epoch with a stream of its own (same seed, same order). With `splits.augment` set, each
    minibatch's x is augmented from a second per-worker stream, so the sample order is the
    same with augmentation on or off."""
    n = len(splits.y_train)
    order = _permutation(n, seed)
    if sharding == "dirichlet":
        shard = dirichlet_shards(splits.y_train, num_workers, dirichlet_alpha, seed)[worker]
    else:
        shard = order if sharding == "replicated" else order[worker::num_workers]
    if len(shard) < batch_size:
        raise ConfigError(
            f"dataset.batch_size={batch_size} exceeds worker {worker}'s shard of {len(shard)} "
            f"training samples ({n} split over cluster.num_workers={num_workers}"
            + (f", dataset.dirichlet_alpha={dirichlet_alpha})" if sharding == "dirichlet" else ")")
        )
    return Minibatches(splits, shard, batch_size, seed * 1_000_003 + worker + 1)


class Minibatches:
    """A worker's endless minibatches from its shard; `size` may change between two of them
    (a synchronous run that re-assigns batch sizes), the epoch's order going on."""

    def __init__(self, splits: Splits, shard: torch.Tensor, size: int, stream: int):
        import torch

        self.splits, self.shard, self._size = splits, shard, size
        self.gen = torch.Generator().manual_seed(stream)
        # offset by 2**32: never the seed of any worker's order stream in the same run
        augment = splits.augment
        self.aug_gen = torch.Generator().manual_seed(stream + (1 << 32)) if augment else None
        self._batches = self._run()

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, size: int) -> None:
        if not 1 <= size <= len(self.shard):
            raise RunError(f"a minibatch of {size} samples from a shard of {len(self.shard)}")
        self._size = size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return next(self._batches)

    def _run(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        import torch

        splits, shard, augment = self.splits, self.shard, self.splits.augment
        while True:
            perm, start = torch.randperm(len(shard), generator=self.gen), 0
            while start + self._size <= len(perm):
                # the epoch's order a batch at a time: at 10,000 simulated workers sampling
                # the whole split, gathering it all per worker and epoch would dominate
                idx = shard.index_select(0, perm[start : start + self._size])
                start += self._size
                x = splits.x_train.index_select(0, idx)  # as x_train[idx], at half the cost
                yield (
                    (augment(x, self.aug_gen) if augment else x),
                    splits.y_train.index_select(0, idx),
                )

"""Each worker's minibatches: the training split cut into seeded shards (or replicated), and
the choice between the two."""

from __future__ import annotations

import functools
import math
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
    shuffle: str = "auto",
) -> Minibatches:
    """Endless minibatches for one worker: a seeded disjoint shard of the training split
    (`replicated`: the whole split; `dirichlet`: its label-skewed shard), reshuffled every
    epoch with a stream of its own (same seed, same order). With `splits.augment` set, each
    minibatch's x is augmented from a second per-worker stream, so the sample order is the
    same with augmentation on or off. `shuffle`: each epoch's order (`DatasetConfig`)."""
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
    return Minibatches(splits, shard, batch_size, seed * 1_000_003 + worker + 1, shuffle)


AFFINE_FROM = 1 << 16  # shuffle=auto: shards larger than this are shuffled affinely
AFFINE_AHEAD = 256  # affine: the sample indices a worker computes at once (2 kB)


class Minibatches:
    """A worker's endless minibatches from its shard; `size` may change between two of them
    (a synchronous run that re-assigns batch sizes), the epoch's order going on. `take`
    draws the next one's sample indices, `gather` reads them (a simulator draws many
    workers' at once: `stacked`)."""

    def __init__(
        self, splits: Splits, shard: torch.Tensor, size: int, stream: int, shuffle: str = "auto"
    ):
        import torch

        self.splits, self.shard, self._size = splits, shard, size
        self.gen = torch.Generator().manual_seed(stream)
        self.affine = shuffle == "affine" or (shuffle == "auto" and len(shard) > AFFINE_FROM)
        # offset by 2**32: never the seed of any worker's order stream in the same run
        augment = splits.augment
        self.aug_gen = torch.Generator().manual_seed(stream + (1 << 32)) if augment else None
        self._order = self._epoch()  # the first epoch's, drawn at set-up (not at a first step)
        self._indices = self._run()

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
        return self.gather(next(self._indices))

    def take(self) -> torch.Tensor:
        """The next minibatch's sample indices (into the training split)."""
        return next(self._indices)

    def gather(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The minibatch of samples `idx`: (x, augmented if the dataset is, y)."""
        splits = self.splits
        x = splits.x_train.index_select(0, idx)  # as x_train[idx], at half the cost
        x = splits.augment(x, self.aug_gen) if splits.augment else x
        return x, splits.y_train.index_select(0, idx)

    def _run(self) -> Iterator[torch.Tensor]:
        import torch

        shard, n = self.shard, len(self.shard)
        while True:
            order = self._order if self._order is not None else self._epoch()
            self._order = None
            if self.affine:
                a, b = order
            else:
                perm = order
            start, ahead, at = 0, shard[:0], 0  # affine: positions [at, at + len(ahead))
            while start + self._size <= n:
                end = start + self._size
                if not self.affine:
                    yield shard.index_select(0, perm[start:end])
                else:
                    # the epoch's order AFFINE_AHEAD samples at a time: at 10,000 simulated
                    # workers sampling the whole split, all of it per worker and epoch would
                    # dominate, and a few torch operations per minibatch would too
                    if end > at + len(ahead):
                        at, stop = start, min(n, max(end, start + AFFINE_AHEAD))
                        pos = torch.arange(start, stop).mul_(a).add_(b).remainder_(n)
                        ahead = shard.index_select(0, pos)
                    yield ahead[start - at : end - at]
                start = end

    def _epoch(self):
        """The next epoch's order, drawn from the worker's stream: (a, b) of an affine one,
        else a permutation of the shard's positions."""
        import torch

        n = len(self.shard)
        return self._affine(n) if self.affine else torch.randperm(n, generator=self.gen)

    def _affine(self, n: int) -> tuple[int, int]:
        """An epoch's i -> (a*i + b) mod n, a bijection of the shard's positions (a coprime
        to n), drawn from the worker's stream."""
        import torch

        a, b = torch.randint(0, n, (2,), generator=self.gen).tolist()
        a = max(a, 1)
        while math.gcd(a, n) != 1:
            a = a % max(n - 1, 1) + 1
        return a, b


def stacked(draws: list[tuple[Minibatches, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Several workers' minibatches of one size (each its `Minibatches` and the indices it
    took), read at once and stacked: x of shape (workers, size, ...), y likewise; each x
    augmented with its own worker's stream, as `gather` does."""
    import torch

    splits, k = draws[0][0].splits, len(draws)
    idx = torch.cat([i for _, i in draws])
    x = splits.x_train.index_select(0, idx).view(k, -1, *splits.x_train.shape[1:])
    if splits.augment:
        x = torch.stack([splits.augment(x[j], mb.aug_gen) for j, (mb, _) in enumerate(draws)])
    return x, splits.y_train.index_select(0, idx).view(k, -1, *splits.y_train.shape[1:])

"""The dataset interface: the splits a dataset loads, its config base, the registry, and the
cache directory generated datasets are kept in."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Registry

if TYPE_CHECKING:  # torch is imported lazily: the CLI validates configs without it
    import torch


SHARDINGS = ("auto", "disjoint", "replicated", "dirichlet")


@dataclasses.dataclass
class Splits:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    vocab: int = 0  # token datasets: the vocabulary size (labels may not use every token)
    # training-time augmentation: (minibatch x, the worker's generator) -> new x; applied by
    # shard_batches to training minibatches only, never to evaluation
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def regression(self) -> bool:
        """Floating-point targets are a regression (least squares); integers are labels."""
        return self.y_train.is_floating_point()

    @property
    def num_classes(self) -> int:
        """The model's outputs: classes (or tokens), or one per target value in regression."""
        if self.regression:
            return math.prod(self.y_train.shape[1:])  # (N,) targets: one output
        return self.vocab or int(max(self.y_train.max(), self.y_test.max())) + 1


@dataclasses.dataclass
class DatasetConfig(ComponentConfig):
    batch_size: int = 32  # per-worker minibatch size B
    # disjoint: each worker reads its own shard; replicated: each samples the whole training
    # split with its own seeded order; auto: disjoint unless a shard holds less than a batch;
    # dirichlet: label skew, each class split over the workers in proportions drawn from
    # Dirichlet(dirichlet_alpha) (small α: few classes per worker; α → ∞: an IID split)
    sharding: str = "auto"
    dirichlet_alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"dataset.batch_size must be >= 1, got {self.batch_size}")
        if self.sharding not in SHARDINGS:
            raise ConfigError(
                f"dataset.sharding must be one of {', '.join(SHARDINGS)}, got {self.sharding!r}"
            )
        if not self.dirichlet_alpha > 0:
            raise ConfigError(f"dataset.dirichlet_alpha must be > 0, got {self.dirichlet_alpha}")

    def at_least_one(self, *keys: str) -> None:
        """Counts and sizes that must be >= 1, checked by name."""
        for key in keys:
            if getattr(self, key) < 1:
                raise ConfigError(f"dataset.{key} must be >= 1, got {getattr(self, key)}")


class Dataset:
    def __init__(self, cfg: DatasetConfig):
        self.cfg = cfg

    def prepare(self) -> None:
        """Check inputs and build caches, in the parent, before any process starts."""

    def load(self) -> Splits:
        raise NotImplementedError


DATASETS: Registry[Dataset] = Registry("dataset", "dataset", "dataset")


def cache_dir() -> Path:
    root = os.environ.get("STALEBENCH_CACHE") or Path.home() / ".cache" / "stalebench"
    return Path(root)


def _splits(x_tr, y_tr, x_te, y_te) -> Splits:
    import torch

    f = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
    i = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
    return Splits(f(x_tr), i(y_tr), f(x_te), i(y_te))

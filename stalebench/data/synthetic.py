"""Seeded Gaussian classes, generated in memory."""

from __future__ import annotations

import dataclasses

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits, _splits
from stalebench.errors import ConfigError


@dataclasses.dataclass
class SyntheticConfig(DatasetConfig):
    num_train: int = 4000
    num_test: int = 1000
    num_features: int = 20
    num_classes: int = 4
    separation: float = 1.0  # std of the class means; larger = easier
    data_seed: int = 0  # the generator's seed (fixed across run seeds)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least_one("num_train", "num_test", "num_features")
        if self.num_classes < 2:
            raise ConfigError(f"dataset.num_classes must be >= 2, got {self.num_classes}")


@DATASETS.register("synthetic", SyntheticConfig)
class Synthetic(Dataset):
    """Gaussian classes: class means ~ N(0, separation²·I), samples = mean + N(0, I)."""

    def load(self) -> Splits:
        c = self.cfg
        rng = np.random.default_rng(c.data_seed)
        means = rng.normal(0.0, c.separation, size=(c.num_classes, c.num_features))
        n = c.num_train + c.num_test
        y = rng.integers(0, c.num_classes, size=n)
        x = means[y] + rng.normal(size=(n, c.num_features))
        return _splits(x[: c.num_train], y[: c.num_train], x[c.num_train :], y[c.num_train :])

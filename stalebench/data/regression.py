"""A convex problem: seeded synthetic linear regression, trained by least squares (the loss
is chosen from the float targets, see `stalebench.evaluation.objective`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits
from stalebench.errors import ConfigError


@dataclasses.dataclass
class RegressionConfig(DatasetConfig):
    num_train: int = 4000
    num_test: int = 1000
    num_features: int = 20
    noise: float = 0.1  # std of the Gaussian noise added to each target
    sparsity: float = 1.0  # fraction of the entries of w* that are non-zero
    # condition number κ of the features' covariance: feature j's scale falls geometrically
    # from 1 to 1/√κ, so plain gradient steps converge κ times slower along the last one
    conditioning: float = 1.0
    data_seed: int = 0  # the generator's seed (fixed across run seeds)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least_one("num_train", "num_test", "num_features")
        if self.noise < 0:
            raise ConfigError(f"dataset.noise must be >= 0, got {self.noise}")
        if not 0.0 < self.sparsity <= 1.0:
            raise ConfigError(f"dataset.sparsity must be in (0, 1], got {self.sparsity}")
        if not self.conditioning >= 1.0:
            raise ConfigError(f"dataset.conditioning must be >= 1, got {self.conditioning}")


def linear_problem(
    num_samples: int,
    num_features: int,
    noise: float,
    sparsity: float,
    seed: int,
    conditioning: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """y = X w* + ε with X ~ N(0, I), ε ~ N(0, noise²), and w* holding k = max(1,
    round(sparsity·d)) non-zero N(0, 1/k) entries at random positions (so Var(x·w*) ≈ 1
    whatever d and k); returns X (n, d), y (n,) and w* (d,) as float32. With conditioning
    κ > 1, feature j is scaled by κ^(−j/(2(d−1))) (covariance eigenvalues from 1 down to
    1/κ) and w*'s entry j by the inverse, so the signal keeps its variance."""
    rng = np.random.default_rng(seed)
    k = max(1, round(sparsity * num_features))
    w = np.zeros(num_features)
    w[rng.choice(num_features, size=k, replace=False)] = rng.normal(0.0, 1.0 / math.sqrt(k), k)
    x = rng.normal(size=(num_samples, num_features))
    if conditioning > 1.0:
        scale = conditioning ** (-np.arange(num_features) / (2 * max(num_features - 1, 1)))
        x, w = x * scale, w / scale
    y = x @ w + noise * rng.normal(size=num_samples)
    return x.astype(np.float32), y.astype(np.float32), w.astype(np.float32)


@DATASETS.register("regression", RegressionConfig)
class Regression(Dataset):
    """Synthetic least squares: one draw of `linear_problem` split into train and test;
    targets are float32 of shape (N,), which makes the loss ½·mean((f(x) − y)²)."""

    def problem(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.cfg
        n = c.num_train + c.num_test
        return linear_problem(n, c.num_features, c.noise, c.sparsity, c.data_seed, c.conditioning)

    def true_weights(self) -> np.ndarray:
        """w*, the weights the targets were generated from."""
        return self.problem()[2]

    def load(self) -> Splits:
        import torch

        x, y, _ = self.problem()
        n = self.cfg.num_train
        t = torch.from_numpy
        return Splits(t(x[:n].copy()), t(y[:n].copy()), t(x[n:].copy()), t(y[n:].copy()))

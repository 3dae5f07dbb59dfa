"""MNIST-1D, generated locally by the reference package and cached."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits, _splits, cache_dir
from stalebench.errors import ConfigError


@dataclasses.dataclass
class MNIST1DConfig(DatasetConfig):
    num_samples: int = 5000  # train + test, as in the reference generator
    train_split: float = 0.8
    data_seed: int = 42  # the reference dataset's seed

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_samples < 20:
            raise ConfigError(f"dataset.num_samples must be >= 20, got {self.num_samples}")
        if not 0.0 < self.train_split < 1.0:
            raise ConfigError(f"dataset.train_split must be in (0, 1), got {self.train_split}")


@DATASETS.register("mnist1d", MNIST1DConfig)
class MNIST1D(Dataset):
    """MNIST-1D (Greydanus 2020), generated locally by the reference `make_dataset()`
    (never `get_dataset()`, which downloads) and cached as .npz."""

    def path(self) -> Path:
        c = self.cfg
        return cache_dir() / f"mnist1d-n{c.num_samples}-s{c.data_seed}-split{c.train_split}.npz"

    def prepare(self) -> None:
        path = self.path()
        if path.exists():
            return
        os.environ.setdefault("MPLBACKEND", "Agg")  # mnist1d imports pyplot
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples, args.seed = self.cfg.num_samples, self.cfg.data_seed
        args.train_split = self.cfg.train_split
        state = np.random.get_state()  # make_dataset seeds the global generator
        try:
            d = make_dataset(args)
        finally:
            np.random.set_state(state)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
        os.replace(tmp, path)  # atomic: concurrent runs never read a half-written file

    def load(self) -> Splits:
        self.prepare()
        with np.load(self.path()) as d:
            return _splits(d["x"], d["y"], d["x_test"], d["y_test"])

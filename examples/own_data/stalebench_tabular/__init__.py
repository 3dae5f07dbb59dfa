"""An out-of-tree stalebench plugin that brings a dataset and a model: a classification
table read from your own CSV files (`dataset=csv`) and a residual MLP (`model=resmlp`).

Install it (`pip install -e examples/own_data`), make a table if you have none
(`python -m stalebench_tabular.spirals data/spirals`), and run:
    stalebench dataset=csv dataset.dir=data/spirals model=resmlp
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np

from stalebench.data import DATASETS, Dataset, DatasetConfig, Splits
from stalebench.errors import ConfigError
from stalebench.models import MODELS
from stalebench.registry import ComponentConfig

SPLITS = ("train", "test")  # <dir>/train.csv and <dir>/test.csv


@dataclasses.dataclass
class CSVConfig(DatasetConfig):
    dir: str = ""  # the folder holding train.csv and test.csv (absolute, or from the cwd)
    label: str = "label"  # the column of class labels, integers 0 .. C-1; the rest: features


@DATASETS.register("csv", CSVConfig)
class CSVTable(Dataset):
    """A table of numeric features and an integer label per row, one CSV file per split
    with a header line; every column other than `label` is a feature."""

    def prepare(self) -> None:
        """In the parent, before any process starts: the files exist and have the label
        column (an error names the key and the value)."""
        for split in SPLITS:
            self._columns(split)

    def load(self) -> Splits:
        """Every process calls this and gets the same tensors (reading a file is
        deterministic; a generated dataset must seed its own generator)."""
        import torch

        arrays = {}
        for split in SPLITS:
            columns = self._columns(split)
            table = np.loadtxt(self._path(split), delimiter=",", skiprows=1, ndmin=2)
            y = table[:, columns.index(self.cfg.label)]
            if not np.array_equal(y, np.round(y)) or y.min() < 0:
                raise ConfigError(
                    f"dataset.label={self.cfg.label!r}: {self._path(split)} holds labels "
                    "that are not integers >= 0"
                )
            x = np.delete(table, columns.index(self.cfg.label), axis=1)
            arrays[split] = (
                torch.as_tensor(x, dtype=torch.float32),
                torch.as_tensor(y, dtype=torch.int64),
            )
        (x_train, y_train), (x_test, y_test) = arrays["train"], arrays["test"]
        return Splits(x_train, y_train, x_test, y_test)

    def _path(self, split: str) -> Path:
        return Path(self.cfg.dir) / f"{split}.csv"

    def _columns(self, split: str) -> list[str]:
        if not self.cfg.dir:
            raise ConfigError("dataset.dir is empty: the folder holding train.csv and test.csv")
        path = self._path(split)
        if not path.is_file():
            raise ConfigError(f"dataset.dir={self.cfg.dir}: no {path.name} in it")
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if self.cfg.label not in header:
            raise ConfigError(
                f"dataset.label={self.cfg.label!r}: not a column of {path} "
                f"(its columns: {', '.join(header)})"
            )
        return header


@dataclasses.dataclass
class ResMLPConfig(ComponentConfig):
    width: int = 64  # the residual stream's width
    blocks: int = 2  # residual blocks: x + W2 ReLU(W1 LayerNorm(x))

    def __post_init__(self) -> None:
        for key in ("width", "blocks"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")


@MODELS.register("resmlp", ResMLPConfig)
def resmlp(cfg: ResMLPConfig, input_shape: tuple[int, ...], num_classes: int):
    """A residual MLP on the flattened input: its forward maps a batch (B, *input_shape) to
    logits (B, num_classes). stalebench seeds torch's generator before calling this, so
    every process builds the same initial parameters."""
    from stalebench_tabular.nets import ResMLP

    return ResMLP(int(np.prod(input_shape)), num_classes, cfg.width, cfg.blocks)

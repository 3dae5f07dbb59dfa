"""MNIST read from the standard local IDX files (optionally gzipped), never downloaded."""

from __future__ import annotations

import dataclasses
import gzip
import struct
from pathlib import Path

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits, _splits
from stalebench.errors import ConfigError

MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
# where the four files come from (stalebench never downloads): LeCun's page, or the mirror
# torchvision downloads from
SOURCE = (
    "get them from https://yann.lecun.com/exdb/mnist/ or its mirror "
    "https://ossci-datasets.s3.amazonaws.com/mnist/ (stalebench downloads nothing)"
)


@dataclasses.dataclass
class MNISTConfig(DatasetConfig):
    root: str = "data/mnist"  # directory holding the four IDX files (optionally .gz)


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (LeCun's format: magic 0x0000 0x08 ndim, big-endian dims, uint8)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        zero, dtype, ndim = struct.unpack(">HBB", data[:4])
        dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    except (OSError, EOFError, struct.error) as exc:
        raise ConfigError(f"dataset.root: cannot read IDX file {path}: {exc}") from exc
    if zero != 0 or dtype != 0x08:
        raise ConfigError(f"dataset.root: {path} is not an unsigned-byte IDX file")
    expected = 4 + 4 * ndim + int(np.prod(dims))
    if len(data) != expected:
        raise ConfigError(
            f"dataset.root: {path} holds {len(data)} bytes, its header says {expected}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


@DATASETS.register("mnist", MNISTConfig)
class MNIST(Dataset):
    """MNIST read from the standard IDX files in `dataset.root`; pixels scaled to [0, 1]
    and standardised with the usual mean 0.1307 and std 0.3081."""

    def files(self) -> dict[str, Path]:
        root = Path(self.cfg.root).expanduser()
        expected = ", ".join(f"{n}[.gz]" for n in MNIST_FILES.values())
        if not root.is_dir():
            raise ConfigError(
                f"dataset.root: directory {str(root)!r} does not exist; "
                f"expected it to hold the MNIST IDX files {expected}: {SOURCE}"
            )
        found = {}
        for key, name in MNIST_FILES.items():
            for candidate in (root / name, root / f"{name}.gz"):
                if candidate.exists():
                    found[key] = candidate
                    break
            else:
                raise ConfigError(
                    f"dataset.root: {str(root)!r} has no {name} (or {name}.gz); "
                    f"expected the MNIST IDX files {expected}: {SOURCE}"
                )
        return found

    def prepare(self) -> None:
        self.files()

    def load(self) -> Splits:
        arrays = {k: read_idx(p) for k, p in self.files().items()}
        for split in ("train", "test"):
            if len(arrays[f"x_{split}"]) != len(arrays[f"y_{split}"]):
                raise ConfigError(
                    f"dataset.root: {split} split has {len(arrays[f'x_{split}'])} images but "
                    f"{len(arrays[f'y_{split}'])} labels"
                )
        scale = lambda a: (a.astype(np.float32) / 255.0 - 0.1307) / 0.3081  # noqa: E731
        return _splits(
            scale(arrays["x_train"]), arrays["y_train"], scale(arrays["x_test"]), arrays["y_test"]
        )

"""CIFAR-10 read from the standard local python-pickle batches (`cifar-10-batches-py`), never
downloaded, with the standard training augmentation (random 4-pixel-padded crop and
horizontal flip) drawn from each worker's own seeded stream."""

from __future__ import annotations

import dataclasses
import functools
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    import torch

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
SHAPE = (3, 32, 32)  # channel-major RGB, as the 3,072 bytes of a row are stored
NUM_CLASSES = 10
# the usual per-channel statistics of the CIFAR-10 training images, pixels scaled to [0, 1]
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PADDING = 4  # He et al. 2016, §4.2: "4 pixels are padded on each side"
# where the batches come from (stalebench never downloads): Krizhevsky's page
SOURCE = (
    "get them from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, which unpacks to "
    "cifar-10-batches-py/ (stalebench downloads nothing)"
)


@dataclasses.dataclass
class CIFAR10Config(DatasetConfig):
    root: str = "data/cifar-10-batches-py"  # data_batch_1..5 and test_batch (python pickles)
    augment: bool = True  # random crop (4-pixel padding) + horizontal flip, training only


# The globals a CIFAR batch pickle may name: numpy's array and dtype reconstructors (numpy 1
# and 2 spell the module differently) and the bytes constructor of Python 3 protocol-2
# pickles. Anything else is refused, so a data file never runs code.
_SAFE_GLOBALS = {
    (module, name)
    for core in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{core}.multiarray", "_reconstruct"),
        (f"{core}.multiarray", "scalar"),
        (f"{core}.numeric", "_frombuffer"),
    )
} | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _field(batch: dict, key: str):
    """A batch's entry under its bytes key (the original Python 2 pickles) or str key."""
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 batch file (Krizhevsky 2009, the python version): a pickled dict whose
    b'data' is a uint8 array N×3072 (1,024 red, then green, then blue bytes of a 32×32 image)
    and b'labels' a list of N ints in 0..9; returns images (N, 3, 32, 32) and labels (N,)."""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
        data, labels = _field(batch, "data"), _field(batch, "labels")
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"dataset.root: cannot read CIFAR-10 batch {path}: {type(exc).__name__}: {exc}"
        ) from exc
    data = np.asarray(data)
    labels = np.asarray(labels)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != int(np.prod(SHAPE)):
        raise ConfigError(
            f"dataset.root: {path} holds data of shape {data.shape} and dtype {data.dtype}; "
            f"a CIFAR-10 batch holds uint8 rows of {int(np.prod(SHAPE))} bytes"
        )
    if labels.ndim != 1 or len(labels) != len(data) or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"dataset.root: {path} holds {len(data)} images but labels of shape {labels.shape} "
            f"and dtype {labels.dtype}"
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ConfigError(
            f"dataset.root: {path} has labels in [{labels.min()}, {labels.max()}]; "
            f"CIFAR-10 labels are 0..{NUM_CLASSES - 1}"
        )
    return data.reshape(-1, *SHAPE), labels.astype(np.int64)


def normalise(images: np.ndarray) -> np.ndarray:
    """uint8 images (N, 3, H, W) → float32 scaled to [0, 1] and standardised per channel with
    the usual CIFAR-10 mean and std."""
    mean = np.asarray(MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(STD, dtype=np.float32).reshape(1, 3, 1, 1)
    return (images.astype(np.float32) / 255.0 - mean) / std


def crop_and_flip(
    x: torch.Tensor, gen: torch.Generator, padding: int, fill: torch.Tensor
) -> torch.Tensor:
    """The standard CIFAR augmentation (He et al. 2016, §4.2), per sample: pad each side by
    `padding` pixels of `fill` (per channel), crop a random window of the original size, and
    flip it horizontally with probability ½; every draw comes from `gen`."""
    import torch

    b, c, h, w = x.shape
    padded = fill.to(x).view(1, c, 1, 1).expand(b, c, h + 2 * padding, w + 2 * padding)
    padded = padded.clone()
    padded[:, :, padding : padding + h, padding : padding + w] = x
    dy = torch.randint(0, 2 * padding + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * padding + 1, (b,), generator=gen)
    flip = torch.rand(b, generator=gen) < 0.5
    # every h×w window of the padded images as a view (B, C, 2p+1, 2p+1, H, W); one pick each
    windows = padded.unfold(2, h, 1).unfold(3, w, 1)
    out = windows[torch.arange(b), :, dy, dx]
    return torch.where(flip[:, None, None, None], out.flip(3), out)


def standard_augmentation() -> functools.partial:
    """Crop and flip with zero padding in pixel space (black, as torchvision's RandomCrop
    pads before Normalize): the fill is pixel 0 after normalisation, −mean/std per channel."""
    import torch

    fill = torch.tensor([-m / s for m, s in zip(MEAN, STD, strict=True)], dtype=torch.float32)
    return functools.partial(crop_and_flip, padding=PADDING, fill=fill)


@DATASETS.register("cifar10", CIFAR10Config)
class CIFAR10(Dataset):
    """CIFAR-10 (Krizhevsky 2009) from the python batches in `dataset.root`: 50,000 training
    images (data_batch_1..5) and 10,000 test images (test_batch), 3×32×32, standardised per
    channel; training minibatches augmented when `dataset.augment`."""

    def files(self) -> dict[str, Path]:
        root = Path(self.cfg.root).expanduser()
        expected = ", ".join((*TRAIN_FILES, TEST_FILE))
        if not root.is_dir():
            raise ConfigError(
                f"dataset.root: directory {str(root)!r} does not exist; expected it to hold "
                f"the CIFAR-10 python batches {expected}: {SOURCE}"
            )
        found = {}
        for name in (*TRAIN_FILES, TEST_FILE):
            if not (root / name).is_file():
                raise ConfigError(
                    f"dataset.root: {str(root)!r} has no {name}; "
                    f"expected the CIFAR-10 python batches {expected}: {SOURCE}"
                )
            found[name] = root / name
        return found

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validated uint8 images and int64 labels: train (all five batches), then test. Read
        once per instance: the parent's `prepare` then `load` do not read the files twice."""
        if not hasattr(self, "_arrays"):
            files = self.files()
            train = [read_batch(files[name]) for name in TRAIN_FILES]
            x_test, y_test = read_batch(files[TEST_FILE])
            x_train = np.concatenate([x for x, _ in train])
            y_train = np.concatenate([y for _, y in train])
            self._arrays = (x_train, y_train, x_test, y_test)
        return self._arrays

    def prepare(self) -> None:
        self.arrays()  # reads every batch: a corrupt file fails here, before any process

    def load(self) -> Splits:
        import torch

        x_train, y_train, x_test, y_test = self.arrays()
        return Splits(
            torch.from_numpy(normalise(x_train)),
            torch.from_numpy(y_train),
            torch.from_numpy(normalise(x_test)),
            torch.from_numpy(y_test),
            augment=standard_augmentation() if self.cfg.augment else None,
        )

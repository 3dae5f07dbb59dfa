"""Datasets: generated (synthetic, MNIST-1D, least-squares regression) or read from local
files (MNIST IDX, CIFAR-10 pickles); never downloaded. The parent prepares (validates files,
generates and caches) before any process starts; every process then loads the same arrays
and each worker reads its own shard."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import math
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Registry

if TYPE_CHECKING:  # torch is imported lazily: the CLI validates configs without it
    import torch


SHARDINGS = ("auto", "disjoint", "replicated")


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
    # split with its own seeded order; auto: disjoint unless a shard holds less than a batch
    sharding: str = "auto"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"dataset.batch_size must be >= 1, got {self.batch_size}")
        if self.sharding not in SHARDINGS:
            raise ConfigError(
                f"dataset.sharding must be one of {', '.join(SHARDINGS)}, got {self.sharding!r}"
            )

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


MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


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
                f"expected it to hold the MNIST IDX files {expected}"
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
                    f"expected the MNIST IDX files {expected}"
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


@functools.lru_cache(maxsize=4)
def _permutation(n: int, seed: int) -> torch.Tensor:
    """The seeded order that splits the training set into shards (computed once per run,
    not once per worker: a simulator with 1,000 workers builds 1,000 shards)."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


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
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless minibatches for one worker: a seeded disjoint shard of the training split
    (`replicated`: the whole split), reshuffled every epoch with a stream of its own (same
    seed, same order). With `splits.augment` set, each minibatch's x is augmented from a
    second per-worker stream, so the sample order is the same with augmentation on or off."""
    import torch

    n = len(splits.y_train)
    order = _permutation(n, seed)
    shard = order if sharding == "replicated" else order[worker::num_workers]
    if len(shard) < batch_size:
        raise ConfigError(
            f"dataset.batch_size={batch_size} exceeds worker {worker}'s shard of {len(shard)} "
            f"training samples ({n} split over cluster.num_workers={num_workers})"
        )
    stream = seed * 1_000_003 + worker + 1
    gen = torch.Generator().manual_seed(stream)
    augment = splits.augment
    # offset by 2**32: never the seed of any worker's order stream in the same run
    aug_gen = torch.Generator().manual_seed(stream + (1 << 32)) if augment else None
    while True:
        order = shard[torch.randperm(len(shard), generator=gen)]
        for start in range(0, len(order) - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            x = splits.x_train[idx]
            yield (augment(x, aug_gen) if augment else x), splits.y_train[idx]


@dataclasses.dataclass
class CharsConfig(DatasetConfig):
    # a UTF-8 text file (e.g. tiny-Shakespeare's input.txt); empty = the generated corpus
    path: str = ""
    context: int = 64  # characters per sequence; the model predicts each next character
    val_fraction: float = 0.1  # the file's tail, held out for validation
    corpus_chars: int = 400_000  # generated corpus: its length
    corpus_words: int = 400  # generated corpus: distinct words
    corpus_branching: int = 4  # generated corpus: the words that may follow each word
    data_seed: int = 0  # generated corpus: its seed (fixed across run seeds)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context < 2:
            raise ConfigError(f"dataset.context must be >= 2, got {self.context}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"dataset.val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.corpus_chars < 1000:
            raise ConfigError(f"dataset.corpus_chars must be >= 1000, got {self.corpus_chars}")
        self.at_least_one("corpus_words", "corpus_branching")


def generated_corpus(num_chars: int, seed: int, num_words: int = 120, branching: int = 4) -> str:
    """A seeded source with structure at two scales: `num_words` random words spelled from
    26 letters, strung by a sparse first-order Markov chain over words (each word is followed
    by one of `branching` others, with Dirichlet weights), in sentences of 4-12 words. A
    character model first learns the spelling, then the word transitions; more words and
    branches make a task that takes longer to learn."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 8))) for _ in range(num_words)]
    successors = rng.integers(0, len(words), size=(len(words), branching))
    weights = rng.dirichlet(np.ones(branching), size=len(words))
    out, size, w = [], 0, int(rng.integers(len(words)))
    while size < num_chars:
        sentence = []
        for _ in range(int(rng.integers(4, 13))):
            sentence.append(words[w])
            w = int(successors[w, rng.choice(branching, p=weights[w])])
        text = " ".join(sentence).capitalize() + ". "
        out.append(text)
        size += len(text)
    return "".join(out)[:num_chars]


@DATASETS.register("chars", CharsConfig)
class Chars(Dataset):
    """Character-level language modelling: the text (a local file, or the generated corpus)
    cut into non-overlapping sequences of `context` + 1 characters; x is a sequence, y the
    same shifted by one. The last `val_fraction` of the text is the validation split."""

    def text(self) -> str:
        c = self.cfg
        if not c.path:
            return generated_corpus(c.corpus_chars, c.data_seed, c.corpus_words, c.corpus_branching)
        path = Path(c.path).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"dataset.path: cannot read text file {str(path)!r}: {exc}") from exc
        return text

    def prepare(self) -> None:
        text, c = self.text(), self.cfg
        need = 2 * (c.context + 1)
        if min(len(text) * c.val_fraction, len(text) * (1 - c.val_fraction)) < need:
            raise ConfigError(
                f"dataset.path: {c.path or 'the generated corpus'} has {len(text)} characters; "
                f"each split needs at least {need} (2 sequences of dataset.context + 1)"
            )

    def load(self) -> Splits:
        import torch

        text, c = self.text(), self.cfg
        chars = sorted(set(text))
        lookup = {ch: i for i, ch in enumerate(chars)}
        ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.int64)
        cut = int(len(ids) * (1 - c.val_fraction))

        def windows(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            n = (len(part) - 1) // c.context
            x = part[: n * c.context].view(n, c.context)
            y = part[1 : n * c.context + 1].view(n, c.context)
            return x, y

        return Splits(*windows(ids[:cut]), *windows(ids[cut:]), vocab=len(chars))


# Datasets in modules of their own register on import: `import stalebench.data` has them all.
from stalebench.data import cifar, regression  # noqa: E402, F401

"""Datasets: generated (synthetic, MNIST-1D, least-squares regression) or read from local
files (MNIST IDX, CIFAR-10 pickles), or shapes without values for cost-only runs; never
downloaded. The parent prepares (validates files,
generates and caches) before any process starts; every process then loads the same arrays
and each worker reads its own shard.

The interface is in `base`, worker sharding in `sharding`, and each dataset in a module of
its own; this package re-exports their public names, and importing it registers them all."""

from stalebench.data import cifar, regression
from stalebench.data.base import DATASETS, SHARDINGS, Dataset, DatasetConfig, Splits, cache_dir
from stalebench.data.chars import Chars, CharsConfig, generated_corpus
from stalebench.data.mnist import MNIST, MNIST_FILES, MNISTConfig, read_idx
from stalebench.data.mnist1d import MNIST1D, MNIST1DConfig
from stalebench.data.shape import Shape, ShapeConfig
from stalebench.data.sharding import resolve_sharding, shard_batches
from stalebench.data.synthetic import Synthetic, SyntheticConfig

__all__ = [
    "DATASETS",
    "MNIST",
    "MNIST1D",
    "MNIST_FILES",
    "SHARDINGS",
    "Chars",
    "CharsConfig",
    "Dataset",
    "DatasetConfig",
    "MNIST1DConfig",
    "MNISTConfig",
    "Shape",
    "ShapeConfig",
    "Splits",
    "Synthetic",
    "SyntheticConfig",
    "cache_dir",
    "cifar",
    "generated_corpus",
    "read_idx",
    "regression",
    "resolve_sharding",
    "shard_batches",
]

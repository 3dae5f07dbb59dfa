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
SHUFFLES = ("auto", "randperm", "affine")
# the seed of the validation carve (`Splits.hold_out`): a constant, not the run's seed, so
# every arm and seed of a tuning stage is selected on the very same examples
HOLDOUT_SEED = 0x5EED_7A1


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
    # eval.split=val: examples carved out of the training split (`hold_out`), evaluated
    # instead of the test split; None otherwise
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    # the classes, where the labels cannot be counted (a dataset of shapes without values,
    # `dataset=shape`); 0: counted from the labels
    classes: int = 0

    def hold_out(self, fraction: float, seed: int = HOLDOUT_SEED) -> Splits:
        """These splits with round(fraction · n) training examples held out as the
        validation split: a fixed carve (seeded by `seed`, a constant by default, never the
        run's), the rest kept as the training split in its original order, so workers shard
        only what is left; the test split is kept (its labels still count the classes) but
        a run evaluates the validation split instead."""
        import torch

        n = len(self.y_train)
        k = round(n * fraction)
        if not 1 <= k < n:
            raise ConfigError(
                f"eval.validation_fraction={fraction} holds out {k} of the {n} training "
                "examples: at least one must be held out and one left to train on"
            )
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        val, train = order[:k].sort().values, order[k:].sort().values
        return dataclasses.replace(
            self,
            x_train=self.x_train[train],
            y_train=self.y_train[train],
            x_val=self.x_train[val],
            y_val=self.y_train[val],
        )

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def regression(self) -> bool:
        """Floating-point targets are a regression (least squares); integers are labels."""
        return self.y_train.is_floating_point()

    @property
    def held_out(self) -> tuple[str, torch.Tensor, torch.Tensor]:
        """The split a run evaluates, as (name, x, y): the validation split when these
        splits hold one out (`hold_out`), else the test split."""
        if self.x_val is not None:
            return "val", self.x_val, self.y_val
        return "test", self.x_test, self.y_test

    def check(self, dataset: str) -> None:
        """Refuse data no run can learn from or measure, by name (`dataset`: how the config
        names it, e.g. "dataset=mnist"): regression targets without variance (nothing to
        fit), and a classification task with a class that is missing from the split the run
        evaluates (its accuracy could never count it) or from the training split."""
        if self.regression:
            if len(self.y_train) > 1 and bool((self.y_train == self.y_train[0]).all()):
                value = self.y_train[0].flatten()[:3].tolist()
                raise ConfigError(
                    f"{dataset}: every training target is {value} (zero variance): a "
                    "regression has nothing to fit"
                )
            return
        if self.vocab or self.y_train.is_meta:  # a language model's labels need not use
            return  # every token; labels without values (`dataset=shape`) have none to check
        import torch

        name, _, y_held = self.held_out
        classes = self.num_classes
        for split, y in (("training", self.y_train), (name, y_held)):
            missing = (torch.bincount(y.flatten(), minlength=classes) == 0).nonzero().flatten()
            if len(missing):
                some = ", ".join(str(c) for c in missing[:5].tolist())
                raise ConfigError(
                    f"{dataset}: {len(missing)} of its {classes} classes (class {some}) "
                    f"have no example in the {split} split of {len(y)} examples"
                    + (", which an accuracy could never count" if split != "training" else "")
                )

    @property
    def num_classes(self) -> int:
        """The model's outputs: classes (or tokens), or one per target value in regression."""
        if self.regression:
            return math.prod(self.y_train.shape[1:])  # (N,) targets: one output
        if self.vocab or self.classes:
            return self.vocab or self.classes
        held = () if self.y_val is None else (self.y_val.max(),)
        return int(max(self.y_train.max(), self.y_test.max(), *held)) + 1


@dataclasses.dataclass
class DatasetConfig(ComponentConfig):
    batch_size: int = 32  # per-worker minibatch size B
    # disjoint: each worker reads its own shard; replicated: each samples the whole training
    # split with its own seeded order; auto: disjoint unless a shard holds less than a batch;
    # dirichlet: label skew, each class split over the workers in proportions drawn from
    # Dirichlet(dirichlet_alpha) (small α: few classes per worker; α → ∞: an IID split)
    sharding: str = "auto"
    dirichlet_alpha: float = 1.0
    # each worker's order of its shard, new every epoch: randperm (a seeded permutation,
    # drawn whole at the epoch's first minibatch), affine (i -> (a*i + b) mod n over the
    # shard, a, b drawn per epoch: O(1) to start, a minibatch at a time), or auto: affine for
    # shards of more than 65,536 samples (a simulator's thousands of workers each sampling a
    # large split), randperm otherwise. The shards themselves are cut in a seeded random
    # order, so an affine epoch visits its shard's samples in a random order too.
    shuffle: str = "auto"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"dataset.batch_size must be >= 1, got {self.batch_size}")
        if self.sharding not in SHARDINGS:
            raise ConfigError(
                f"dataset.sharding must be one of {', '.join(SHARDINGS)}, got {self.sharding!r}"
            )
        if self.shuffle not in SHUFFLES:
            raise ConfigError(
                f"dataset.shuffle must be one of {', '.join(SHUFFLES)}, got {self.shuffle!r}"
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

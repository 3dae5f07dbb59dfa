"""A dataset of shapes without values, for cost-only runs (`sim.numerics=false`): a
paper's inputs (ImageNet's 1,281,167 images of 3×224×224, by default) as tensors on the meta
device, which hold a size and no storage. A cost-only run needs only what decides its
costs — an example's shape for the model's step, the number of examples for its epochs —
so a paper-scale run needs neither the data nor the memory for it."""

from __future__ import annotations

import dataclasses

from stalebench.data.base import DATASETS, Dataset, DatasetConfig, Splits
from stalebench.errors import ConfigError


@dataclasses.dataclass
class ShapeConfig(DatasetConfig):
    input_shape: list[int] = dataclasses.field(default_factory=lambda: [3, 224, 224])
    num_classes: int = 1000
    num_train: int = 1_281_167  # ImageNet-1k's training images
    num_test: int = 50_000  # and its validation images
    # false: float inputs of input_shape and one class each; true: sequences of token ids
    # (input_shape: [length]) whose labels are the next token at every position, over a
    # vocabulary of num_classes tokens (a translation or language model's batch)
    tokens: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.at_least_one("num_train", "num_test")
        if not self.input_shape or any(int(s) < 1 for s in self.input_shape):
            raise ConfigError(
                f"dataset.input_shape must be a list of sizes >= 1, got {list(self.input_shape)}"
            )
        if self.num_classes < 2:
            raise ConfigError(f"dataset.num_classes must be >= 2, got {self.num_classes}")
        if self.tokens and len(self.input_shape) != 1:
            raise ConfigError(
                f"dataset.tokens=true needs dataset.input_shape=[length], got "
                f"{list(self.input_shape)}"
            )


@DATASETS.register("shape", ShapeConfig)
class Shape(Dataset):
    """Inputs of `input_shape` (float32) and class labels, on the meta device: no values."""

    def load(self) -> Splits:
        import torch

        c, meta = self.cfg, torch.device("meta")
        shape = [int(s) for s in c.input_shape]
        if c.tokens:  # token ids in, the next token at every position out
            x = lambda n: torch.empty(n, *shape, dtype=torch.int64, device=meta)  # noqa: E731
            return Splits(x(c.num_train), x(c.num_train), x(c.num_test), x(c.num_test),
                          vocab=c.num_classes)  # fmt: skip
        x = lambda n: torch.empty(n, *shape, device=meta)  # noqa: E731
        y = lambda n: torch.empty(n, dtype=torch.int64, device=meta)  # noqa: E731
        return Splits(x(c.num_train), y(c.num_train), x(c.num_test), y(c.num_test),
                      classes=c.num_classes)  # fmt: skip

"""Small models for 1-D and 2-D classification inputs, ResNet-20 for images, and a linear
model for regression. A registered model is a builder `(cfg, input_shape, num_classes) ->
nn.Module`; the networks live in `nets` so that configs load without importing torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Registry

if TYPE_CHECKING:
    from torch import nn

MODELS: Registry[Callable[..., nn.Module]] = Registry("model", "model", "model")


@dataclasses.dataclass
class LogRegConfig(ComponentConfig):
    pass


@MODELS.register("logreg", LogRegConfig)
def logreg(cfg: LogRegConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    from stalebench.models.nets import mlp

    return mlp(input_shape, num_classes, hidden=[])


@dataclasses.dataclass
class LinearConfig(ComponentConfig):
    pass


@MODELS.register("linear", LinearConfig)
def linear(cfg: LinearConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """One linear layer (no hidden layer) on the flattened input, one output per target value:
    a single output on a regression dataset, whose `num_classes` is 1."""
    from stalebench.models.nets import mlp

    return mlp(input_shape, num_classes, hidden=[])


@dataclasses.dataclass
class MLPConfig(ComponentConfig):
    hidden: list[int] = dataclasses.field(default_factory=lambda: [100, 100])  # layer widths

    def __post_init__(self) -> None:
        if any(h < 1 for h in self.hidden):
            raise ConfigError(f"model.hidden widths must be >= 1, got {list(self.hidden)}")


@MODELS.register("mlp", MLPConfig)
def mlp(cfg: MLPConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Fully connected ReLU network on the flattened input."""
    from stalebench.models.nets import mlp

    return mlp(input_shape, num_classes, hidden=list(cfg.hidden))


@dataclasses.dataclass
class CNNConfig(ComponentConfig):
    channels: list[int] = dataclasses.field(default_factory=lambda: [16, 32])  # per conv layer
    kernel_size: int = 3
    batch_norm: bool = False  # BatchNorm after each convolution

    def __post_init__(self) -> None:
        if not self.channels or any(c < 1 for c in self.channels):
            raise ConfigError(f"model.channels must be non-empty, all >= 1, got {self.channels}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"model.kernel_size must be odd and >= 1, got {self.kernel_size}")


@MODELS.register("cnn", CNNConfig)
def cnn(cfg: CNNConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Strided conv stack, Conv1d for (L,) inputs and Conv2d for (H, W), then linear."""
    if len(input_shape) not in (1, 2):
        raise ConfigError(f"model=cnn needs 1-D or 2-D inputs, got shape {input_shape}")
    from stalebench.models.nets import CNN

    return CNN(input_shape, num_classes, list(cfg.channels), cfg.kernel_size, cfg.batch_norm)


@dataclasses.dataclass
class ResNetConfig(ComponentConfig):
    depth: int = 20  # 6n + 2 layers: n basic blocks per stage (20, 32, 44, 56, 110)
    width: int = 16  # channels of the first stage; the next two have 2× and 4×

    def __post_init__(self) -> None:
        if self.depth < 8 or (self.depth - 2) % 6:
            raise ConfigError(
                f"model.depth must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110), "
                f"got {self.depth}"
            )
        if self.width < 1:
            raise ConfigError(f"model.width must be >= 1, got {self.width}")


@MODELS.register("resnet20", ResNetConfig)
def resnet20(cfg: ResNetConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The CIFAR ResNet of He et al. 2016, §4.2 (depth 20 by default), on (C, H, W) images."""
    if len(input_shape) != 3:
        raise ConfigError(
            f"model=resnet20 needs images of shape (channels, height, width), got inputs of "
            f"shape {input_shape} (use it with dataset=cifar10)"
        )
    from stalebench.models.nets import CifarResNet

    return CifarResNet(input_shape[0], num_classes, (cfg.depth - 2) // 6, cfg.width)


@dataclasses.dataclass
class TransformerConfig(ComponentConfig):
    layers: int = 4  # decoder blocks; a pipeline needs at least one per stage
    width: int = 64  # d_model
    heads: int = 4

    def __post_init__(self) -> None:
        for key in ("layers", "width", "heads"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.width % self.heads:
            raise ConfigError(
                f"model.width={self.width} must be a multiple of model.heads={self.heads}"
            )


@MODELS.register("transformer", TransformerConfig)
def transformer(
    cfg: TransformerConfig, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    """Decoder-only language model over sequences of `input_shape = (context,)` token ids
    and a vocabulary of `num_classes` tokens."""
    if len(input_shape) != 1:
        raise ConfigError(f"model=transformer needs token sequences, got shape {input_shape}")
    from stalebench.models.nets import decoder

    return decoder(num_classes, input_shape[0], cfg.width, cfg.heads, cfg.layers)

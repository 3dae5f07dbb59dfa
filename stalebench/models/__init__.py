"""Small models for 1-D and 2-D classification inputs, ResNet-20 for images, and a linear
model for regression. A registered model is a builder `(cfg, input_shape, num_classes) ->
nn.Module`; the networks live in `nets` so that configs load without importing torch.
The papers' networks at full scale for throughput tables (ResNet-50, VGG-11/19, OverFeat-fast,
Das et al.'s DNN, P3's Sockeye RNN) live in `paper`, with their sources and counts."""

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


# --------------------------------------------------------------------------- paper scale
# The papers' networks (`paper`), for throughput and message-size tables: 1,000 classes (an
# ImageNet-shaped dataset) give the published parameter counts, which
# tests/unit/test_paper_models.py checks on the meta device


def needs_images(name: str, input_shape: tuple[int, ...]) -> None:
    if len(input_shape) != 3:
        raise ConfigError(
            f"model={name} needs images of shape (channels, height, width), got inputs of "
            f"shape {input_shape}"
        )


@dataclasses.dataclass
class ResNet50Config(ComponentConfig):
    pass


@MODELS.register("resnet50", ResNet50Config)
def resnet50(cfg: ResNet50Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """ResNet-50, bottleneck stages [3, 4, 6, 3] with v1.5 strides: 25.6M parameters at
    1,000 classes. He et al., CVPR 2016."""
    needs_images("resnet50", input_shape)
    from stalebench.models.paper import ResNet50

    return ResNet50(input_shape[0], num_classes)


@dataclasses.dataclass
class VGG19Config(ComponentConfig):
    pass


@MODELS.register("vgg19", VGG19Config)
def vgg19(cfg: VGG19Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """VGG-19, configuration E without batch norm: 143.7M parameters at 1,000 classes.
    Simonyan & Zisserman, ICLR 2015."""
    needs_images("vgg19", input_shape)
    from stalebench.models.paper import VGG

    return VGG("E", input_shape[0], num_classes)


@dataclasses.dataclass
class VGG11Config(ComponentConfig):
    pass


@MODELS.register("vgg11", VGG11Config)
def vgg11(cfg: VGG11Config, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """VGG-11, configuration A without batch norm (the VGG-A of arXiv 1602.06709): 132.9M
    parameters at 1,000 classes. Simonyan & Zisserman, ICLR 2015."""
    needs_images("vgg11", input_shape)
    from stalebench.models.paper import VGG

    return VGG("A", input_shape[0], num_classes)


@dataclasses.dataclass
class OverFeatConfig(ComponentConfig):
    pass


@MODELS.register("overfeat_fast", OverFeatConfig)
def overfeat_fast(cfg: OverFeatConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """OverFeat's fast model on 231x231 images: 145.9M parameters at 1,000 classes.
    Sermanet et al., ICLR 2014."""
    needs_images("overfeat_fast", input_shape)
    from stalebench.models.paper import OverFeatFast, overfeat_map

    if min(overfeat_map(input_shape[1]), overfeat_map(input_shape[2])) < 1:
        raise ConfigError(
            f"model=overfeat_fast needs images of at least 71x71 (its paper's: 231x231), got "
            f"inputs of shape {input_shape}"
        )
    return OverFeatFast(input_shape[0], num_classes, input_shape[1:])


@dataclasses.dataclass
class DasDNNConfig(ComponentConfig):
    width: int = 2048  # hidden units per layer (a stand-in: the paper's width is unverified)
    layers: int = 7  # weight layers: layers - 1 hidden, then the output

    def __post_init__(self) -> None:
        if self.width < 1:
            raise ConfigError(f"model.width must be >= 1, got {self.width}")
        if self.layers < 2:
            raise ConfigError(f"model.layers must be >= 2, got {self.layers}")


@MODELS.register("das_dnn", DasDNNConfig)
def das_dnn(cfg: DasDNNConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A stand-in for the 7-layer speech DNN of arXiv 1602.06709 (Das et al.): six 2048-wide
    ReLU layers on the flattened input; the paper's sizes are unverified."""
    from stalebench.models.paper import das_dnn

    return das_dnn(input_shape, num_classes, cfg.width, cfg.layers)


@dataclasses.dataclass
class SockeyeConfig(ComponentConfig):
    source_vocab: int = 0  # 0: the dataset's vocabulary (P3's run: 17,192)
    embed: int = 512
    hidden: int = 512  # even: the first encoder layer is bidirectional, hidden/2 each way
    layers: int = 2  # encoder and decoder layers each
    attention: int = 512

    def __post_init__(self) -> None:
        for key in ("embed", "hidden", "layers", "attention"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if self.hidden % 2:
            raise ConfigError(f"model.hidden must be even, got {self.hidden}")
        if self.source_vocab < 0:
            raise ConfigError(f"model.source_vocab must be >= 0, got {self.source_vocab}")


@MODELS.register("sockeye_rnn", SockeyeConfig)
def sockeye_rnn(cfg: SockeyeConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Sockeye's LSTM encoder-decoder with MLP attention, as P3 (SysML 2019) trained it: 27.7M
    parameters at P3's vocabularies. A batch of token ids is its source and its decoder
    input; logits per position out."""
    if len(input_shape) != 1:
        raise ConfigError(f"model=sockeye_rnn needs token sequences, got shape {input_shape}")
    if 0 < cfg.source_vocab < num_classes:
        raise ConfigError(
            f"model.source_vocab={cfg.source_vocab} is smaller than the dataset's vocabulary "
            f"of {num_classes} tokens, which are its source too"
        )
    from stalebench.models.paper import SockeyeRNN

    source = cfg.source_vocab or num_classes
    return SockeyeRNN(source, num_classes, cfg.embed, cfg.hidden, cfg.layers, cfg.attention)

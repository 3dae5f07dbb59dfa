"""The networks themselves (imported only when a model is built, so configs load without torch)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector


def flatten_parameters(model: torch.nn.Module, into: torch.Tensor | None = None) -> torch.Tensor:
    """Make the model's parameters views into one flat tensor and return it: loading a
    worker's parameters is then one copy, not a Python loop over the layers (none, when the
    flat tensor is `into`, a buffer messages arrive in; the model's device is the CPU)."""
    flat = parameters_to_vector(model.parameters()).detach()
    flat = into.copy_(flat) if into is not None else flat.clone()
    params = list(model.parameters())
    for p, view in zip(params, param_views(flat, params), strict=True):
        p.data = view
    return flat


def param_views(flat: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """`flat`'s pieces, laid end to end in the order of `params`, each a view shaped as its
    parameter."""
    views, at = [], 0
    for p in params:
        views.append(flat[at : at + p.numel()].view(p.shape))
        at += p.numel()
    return views


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: list[int]) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


class CNN(nn.Module):
    """Strided conv stack (Conv1d for inputs of shape (L,), Conv2d for (H, W)), then linear."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        channels: list[int],
        kernel_size: int,
        batch_norm: bool = False,
    ):
        super().__init__()
        conv = nn.Conv1d if len(input_shape) == 1 else nn.Conv2d
        norm = nn.BatchNorm1d if len(input_shape) == 1 else nn.BatchNorm2d
        layers: list[nn.Module] = []
        in_ch = 1
        for ch in channels:
            layers.append(conv(in_ch, ch, kernel_size, stride=2, padding=kernel_size // 2))
            layers += [norm(ch)] if batch_norm else []
            layers.append(nn.ReLU())
            in_ch = ch
        self.features = nn.Sequential(*layers)
        with torch.no_grad():
            flat = self.features(torch.zeros(1, 1, *input_shape)).numel()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(flat, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.unsqueeze(1)))


def shortcut_a(x: torch.Tensor, out_channels: int, stride: int) -> torch.Tensor:
    """He et al. 2016's option A shortcut: the identity, subsampled by `stride` and with the
    extra channels zero-padded (no parameters)."""
    x = x[:, :, ::stride, ::stride]
    return nn.functional.pad(x, (0, 0, 0, 0, 0, out_channels - x.shape[1]))


class BasicBlock(nn.Module):
    """Two 3×3 conv-BN layers (the first strided) plus the option-A shortcut, then ReLU
    (He et al. 2016, Fig. 2 left)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.out_channels, self.stride = out_channels, stride
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return nn.functional.relu(out + shortcut_a(x, self.out_channels, self.stride))


class CifarResNet(nn.Module):
    """ResNet for CIFAR (He et al. 2016, §4.2): a 3×3 conv of `width` channels, three stages
    of n basic blocks (width, 2·width, 4·width channels; stride 2 at the start of stages 2
    and 3), global average pooling and a linear layer: 6n + 2 layers (n = 3: ResNet-20)."""

    def __init__(self, in_channels: int, num_classes: int, blocks_per_stage: int, width: int):
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
        ]
        channels = width
        for stage in range(3):
            out = width * 2**stage
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(channels, out, stride))
                channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                # He et al. 2015's initialisation, which the ResNet paper uses for its convs
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class Embed(nn.Module):
    """Token and learned position embeddings: ids (B, T) → hidden states (B, T, C)."""

    def __init__(self, vocab: int, context: int, width: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    """Pre-norm decoder block: causal self-attention, then a 4× GELU MLP."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, c = h.shape
        q, k, v = self.qkv(self.ln1(h)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return h + self.mlp(self.ln2(h))


class Head(nn.Module):
    """Final LayerNorm and the next-token logits (B, T, vocab)."""

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(h))


class Stackable(nn.Sequential):
    """[input part, block × L, output part]: a model the pipeline engine can cut into stages
    between blocks. Run whole, it is the plain, unpipelined model."""


def decoder(vocab: int, context: int, width: int, heads: int, layers: int) -> Stackable:
    """A small GPT: [Embed, Block × layers, Head]."""
    return Stackable(
        Embed(vocab, context, width),
        *(Block(width, heads) for _ in range(layers)),
        Head(width, vocab),
    )

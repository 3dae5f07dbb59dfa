"""The networks themselves (imported only when a model is built, so configs load without torch)."""

from __future__ import annotations

import math

import torch
from torch import nn


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

"""The network, in a module of its own: the config and registration above import no torch,
so the command line checks a config without it."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.inner = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(self.norm(x))


class ResMLP(nn.Module):
    def __init__(self, features: int, num_classes: int, width: int, blocks: int):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.blocks = nn.Sequential(*(Block(width) for _ in range(blocks)))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x.flatten(1))))

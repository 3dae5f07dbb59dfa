"""Server-side update rules: plain SGD and shared momentum (heavy-ball or Nesterov),
with PyTorch's conventions (v ← γv + g; weight decay added to g at the server's θ)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from stalebench.algorithms.base import UPDATES, UpdateConfig, UpdateRule
from stalebench.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class SGDConfig(UpdateConfig):
    pass


@UPDATES.register("sgd", SGDConfig)
class SGD(UpdateRule):
    """θ ← θ − η (g + wd·θ), whatever the gradient's lag (ASGD, docs/algorithms.md §3.1)."""

    elementwise = True

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        params.add_(self.direction(params, grad), alpha=-self.lr)

    def direction(self, params: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        if self.cfg.weight_decay:
            return grad.add(params, alpha=self.cfg.weight_decay)
        return grad


def check_momentum(momentum: float) -> None:
    if not 0.0 <= momentum < 1.0:
        raise ConfigError(f"algorithm.update.momentum must be in [0, 1), got {momentum}")


@dataclasses.dataclass
class MomentumConfig(UpdateConfig):
    momentum: float = 0.9  # γ
    nesterov: bool = False  # Nesterov (θ ← θ − η(g + γv)) instead of heavy ball (θ ← θ − ηv)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum(self.momentum)


@UPDATES.register("momentum", MomentumConfig)
class Momentum(SGD):
    """One momentum buffer at the server shared by all workers (NAG-ASGD when nesterov,
    docs/algorithms.md §3.2): v ← γv + g; θ ← θ − ηv, or θ ← θ − η(g + γv)."""

    def __init__(self, cfg: MomentumConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.buf = params.new_zeros(params.shape)

    def part_state(self) -> dict[str, torch.Tensor]:
        return {"buf": self.buf}

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        g = self.direction(params, grad)
        self.buf.mul_(self.cfg.momentum).add_(g)
        step = g.add(self.buf, alpha=self.cfg.momentum) if self.cfg.nesterov else self.buf
        params.add_(step, alpha=-self.lr)

"""Staleness mitigation at the server: rules that shrink a stale gradient before it is applied,
by its lag (SA), by how far θ actually moved since the worker read it (Gap-Aware), or that
correct it with a first-order Taylor term (DC-ASGD). docs/algorithms.md §7, §8, §11.1.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from stalebench.algorithms.base import UPDATES, UpdateConfig
from stalebench.algorithms.updates import SGD, MomentumConfig
from stalebench.errors import ConfigError
from stalebench.registry import stored

if TYPE_CHECKING:
    import torch


def worker_slot(rule: object, worker: int, num_workers: int) -> int:
    """`worker` as an index into per-worker state; a round's mean gradient (−1) has none."""
    if not 0 <= worker < num_workers:
        name = getattr(rule, "registered_name", type(rule).__name__)
        raise ValueError(
            f"update rule {name!r} keeps per-worker state and needs a worker in "
            f"[0, {num_workers}), got {worker} (a round's averaged gradient has no worker)"
        )
    return worker


def per_worker_copies(params: torch.Tensor, num_workers: int) -> torch.Tensor:
    """num_workers rows, each a copy of θ: θ̂_i = θ₀ for a worker never sent parameters."""
    return params.detach().unsqueeze(0).repeat(num_workers, 1)


class PenalisedStep(SGD):
    """SGD, or one momentum buffer shared by all workers, applied to a direction that the
    subclass has already penalised; the arithmetic is Momentum's, op for op, so a penalty of
    exactly 1 reproduces SGD / Momentum bit for bit (docs/algorithms.md §12)."""

    elementwise = False  # a penalty may read more than the element (a norm, a worker's θ̂)

    def __init__(self, cfg: MomentumConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.buf = params.new_zeros(params.shape) if cfg.momentum else None

    def descend(self, params: torch.Tensor, d: torch.Tensor) -> None:
        """θ ← θ − ηd, or v ← γv + d; θ ← θ − ηv (heavy ball) / θ − η(d + γv) (Nesterov)."""
        if self.buf is None:
            params.add_(d, alpha=-self.lr)
            return
        gamma = self.cfg.momentum
        self.buf.mul_(gamma).add_(d)
        step = d.add(self.buf, alpha=gamma) if self.cfg.nesterov else self.buf
        params.add_(step, alpha=-self.lr)


def _check_nesterov(cfg: MomentumConfig) -> None:
    if cfg.nesterov and not cfg.momentum:
        raise ConfigError(
            "algorithm.update.nesterov=True needs algorithm.update.momentum > 0, got "
            f"momentum={cfg.momentum}"
        )


@dataclasses.dataclass
class StalenessAwareConfig(MomentumConfig):
    momentum: float = 0.0  # γ of one buffer shared by all workers; 0 = no momentum
    nesterov: bool = False  # Nesterov step instead of heavy ball (needs momentum > 0)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nesterov(self)


@UPDATES.register("staleness_aware", StalenessAwareConfig)
class StalenessAware(PenalisedStep):
    """SA: a gradient of lag τ enters the step divided by max(τ, 1), Zhang et al., IJCAI 2016
    (as used by the Gap-Aware paper, docs/algorithms.md §7, A-SA-1).

    Without momentum θ ← θ − (η/max(τ,1))(g + wd·θ): the weight-decay term is divided too,
    as Gap-Aware does with its penalty. With momentum the divided direction enters the shared
    buffer. A round's mean gradient (worker −1) is divided by the round's largest lag."""

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        d = self.direction(params, grad)
        if lag > 1:  # lags 0 and 1 leave d untouched, so SA ≡ SGD / Momentum there exactly
            d = d.div(lag)
        self.descend(params, d)


def check_gap_statistics(beta: float, eps: float) -> None:
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"algorithm.update.beta must be in [0, 1), got {beta}")
    if not eps > 0:
        raise ConfigError(f"algorithm.update.eps must be > 0, got {eps}")


@stored
class GapStatistics:
    """Gap-Aware's yardstick of one step (Barkai et al. 2020, as FTPipe's code computes it):
    an EMA of u² (u: the step direction before this step), bias-corrected, gives
    C = η_max·(RMS + eps) with η_max the largest learning rate seen; a gradient's penalty is
    G = 1 + |θ − θ̂| / C."""

    def __init__(self, params: torch.Tensor, beta: float, eps: float):
        self.beta, self.eps = beta, eps
        self.sq_avg = params.new_zeros(params.shape)  # EMA of u²
        self.steps = 0  # k: EMA updates so far, for the bias correction
        self.lr_max = 0.0  # η_max

    def observe(self, u: torch.Tensor, lr: float) -> None:
        self.sq_avg.mul_(self.beta).addcmul_(u, u, value=1 - self.beta)
        self.steps += 1
        self.lr_max = max(self.lr_max, lr)

    def penalty(self, params: torch.Tensor, sent: torch.Tensor) -> torch.Tensor:
        """G = 1 + |θ − θ̂| / C for the statistics observed so far."""
        c = self.sq_avg.div(1 - self.beta**self.steps).sqrt_()
        c.add_(self.eps).mul_(self.lr_max)
        return params.sub(sent).abs_().div_(c).add_(1)


@dataclasses.dataclass
class GapAwareConfig(MomentumConfig):
    momentum: float = 0.0  # γ of one buffer shared by all workers; 0 = no momentum
    nesterov: bool = False  # Nesterov step instead of heavy ball (needs momentum > 0)
    beta: float = 0.999  # EMA decay of the squared per-step direction that sets C
    eps: float = 1e-8  # added to the bias-corrected RMS in C = η_max·(RMS + eps)

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nesterov(self)
        check_gap_statistics(self.beta, self.eps)


@UPDATES.register("gap_aware", GapAwareConfig)
class GapAware(PenalisedStep):
    """Gap-Aware: divide the gradient element-wise by G = 1 + |θ − θ̂_i| / C, where C is the
    typical one-step move, Barkai, Hakimi & Schuster, ICLR 2020 (docs/algorithms.md §8, FTPipe).

    Order as FTPipe's (A-GA-2): first the EMA of u² with u = the momentum buffer *before*
    this step (or the raw gradient without momentum) and the step count k; then
    C = η_max·(√(EMA/(1 − β^k)) + eps), η_max the largest `self.lr` seen so far (so the
    warm-up's small rates never shrink C later); the weight-decay term is penalised with the
    gradient: (g + wd·θ)/G, then an SGD or momentum step. θ̂_i is a copy of what `params_for`
    last sent worker i (θ₀ until then): N extra copies of θ at the server."""

    per_worker = True

    def __init__(self, cfg: GapAwareConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.sent = per_worker_copies(params, num_workers)  # θ̂_i, one row per worker
        self.gap = GapStatistics(params, cfg.beta, cfg.eps)
        self.penalty: torch.Tensor | None = None  # G of the last gradient applied

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        i = worker_slot(self, worker, self.num_workers)
        self.gap.observe(self.buf if self.buf is not None else grad, self.lr)
        self.penalty = self.gap.penalty(params, self.sent[i])
        self.descend(params, self.direction(params, grad).div(self.penalty))

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        self.sent[worker_slot(self, worker, self.num_workers)].copy_(params)
        return params


@dataclasses.dataclass
class DCASGDConfig(UpdateConfig):
    lam: float = 0.04  # λ of DC-ASGD-c (constant), used when adaptive is False
    adaptive: bool = False  # DC-ASGD-a: λ_t = lam0 / √(MeanSquare_t + 1e-7), element-wise
    lam0: float = 2.0  # λ₀ of DC-ASGD-a
    ms_decay: float = 0.95  # m: MeanSquare_t = m·MeanSquare_{t−1} + (1 − m)·g²

    def __post_init__(self) -> None:
        super().__post_init__()
        for key in ("lam", "lam0"):
            value = getattr(self, key)
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"algorithm.update.{key} must be finite and >= 0, got {value}")
        if not 0.0 <= self.ms_decay < 1.0:
            raise ConfigError(f"algorithm.update.ms_decay must be in [0, 1), got {self.ms_decay}")


# Inside DC-ASGD-a's square root, so a coordinate whose gradients have all been 0 gets a
# large but finite λ (its correction is 0 anyway, since it is proportional to g²).
DC_MS_EPS = 1e-7


@UPDATES.register("dc_asgd", DCASGDConfig)
class DCASGD(SGD):
    """DC-ASGD: g̃ = g + λ·g⊙g⊙(θ − θ̂_i), then θ ← θ − η(g̃ + wd·θ), Zheng et al., ICML 2017
    (docs/algorithms.md §11.1).

    λ is constant (DC-ASGD-c) or adaptive (DC-ASGD-a): MeanSquare ← m·MeanSquare + (1 − m)·g²
    with the arriving raw gradient first, then λ = lam0/√(MeanSquare + 1e-7) element-wise
    (the 1e-7 is ours; the paper divides by √MeanSquare). The correction uses the raw
    gradient; weight decay is added after it, at the master θ. θ̂_i is a copy of what
    `params_for` last sent worker i (θ₀ until then)."""

    elementwise = False  # state beyond θ's shape (per worker, or a read θ)

    per_worker = True

    def __init__(self, cfg: DCASGDConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.sent = per_worker_copies(params, num_workers)  # θ̂_i, one row per worker
        self.mean_square = params.new_zeros(params.shape) if cfg.adaptive else None

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        i = worker_slot(self, worker, self.num_workers)
        params.add_(self.direction(params, self.compensate(params, grad, i)), alpha=-self.lr)

    def compensate(self, params: torch.Tensor, grad: torch.Tensor, i: int) -> torch.Tensor:
        """g + λ·g⊙g⊙(θ − θ̂_i)."""
        correction = params.sub(self.sent[i]).mul_(grad).mul_(grad)
        if self.mean_square is None:
            return grad.add(correction, alpha=self.cfg.lam)
        m = self.cfg.ms_decay
        self.mean_square.mul_(m).addcmul_(grad, grad, value=1 - m)
        lam = self.mean_square.add(DC_MS_EPS).rsqrt_().mul_(self.cfg.lam0)
        return grad.add(correction.mul_(lam))

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        self.sent[worker_slot(self, worker, self.num_workers)].copy_(params)
        return params

"""Momentum for asynchronous workers: one server buffer per worker (Multi-ASGD) and DANA's
look-ahead, which sends each worker where θ will be once every worker's momentum has
applied once more (docs/algorithms.md §3.2, §9).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from stalebench.algorithms.base import UPDATES, UpdateConfig
from stalebench.algorithms.staleness import (
    GapStatistics,
    check_gap_statistics,
    per_worker_copies,
    worker_slot,
)
from stalebench.algorithms.updates import SGD, check_momentum
from stalebench.errors import ConfigError
from stalebench.registry import stored

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class MultiMomentumConfig(UpdateConfig):
    momentum: float = 0.9  # γ of each worker's own buffer at the server

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum(self.momentum)


@UPDATES.register("multi_momentum", MultiMomentumConfig)
class MultiMomentum(SGD):
    """Multi-ASGD: the server keeps one heavy-ball buffer per worker, v_i ← γv_i + (g + wd·θ);
    θ ← θ − ηv_i (the DANA paper's baseline, docs/algorithms.md §3.2; DANA-Zero without its
    look-ahead)."""

    elementwise = False  # state beyond θ's shape (per worker, or a read θ)

    per_worker = True

    def __init__(self, cfg: MultiMomentumConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.bufs = params.new_zeros((num_workers, *params.shape))  # v_i, one row per worker

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        v = self.bufs[worker_slot(self, worker, self.num_workers)]
        v.mul_(self.cfg.momentum).add_(self.direction(params, grad))
        params.add_(v, alpha=-self.lr)


DANA_VARIANTS = ("zero", "slim", "dc")


@dataclasses.dataclass
class DanaConfig(UpdateConfig):
    momentum: float = 0.9  # γ of every worker's momentum
    # zero: per-worker buffers at the server; slim: buffers on the workers, the server keeps
    # only the look-ahead Φ; dc: zero plus delay compensation of each gradient
    variant: str = "zero"
    dc_lambda: float = 2.0  # λ of variant dc, unnormalised as in the DANA code (A-DANA-2)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_momentum(self.momentum)
        if self.variant not in DANA_VARIANTS:
            raise ConfigError(
                f"algorithm.update.variant must be one of {', '.join(DANA_VARIANTS)}, "
                f"got {self.variant!r}"
            )
        if not (self.dc_lambda >= 0 and math.isfinite(self.dc_lambda)):
            raise ConfigError(
                f"algorithm.update.dc_lambda must be finite and >= 0, got {self.dc_lambda}"
            )


@stored
class ServerMomentum:
    """zero (§9.2): per-worker buffers at the server, v_i ← γv_i + (g + wd·θ), θ ← θ − ηv_i,
    with their running sum S; a worker is sent the look-ahead θ − ηγS, η the rate of the
    update last applied (`Dana.applied_lr`; small during warm-up). `keep_sent`: keep each
    worker's look-ahead θ̂_i (θ₀ until sent)."""

    def __init__(self, rule: Dana, params: torch.Tensor, keep_sent: bool):
        self.rule = rule
        n = rule.num_workers
        self.bufs = params.new_zeros((n, *params.shape))  # v_i, one row per worker
        self.buf_sum = params.new_zeros(params.shape)  # S = Σ_i v_i
        self.sent = per_worker_copies(params, n) if keep_sent else None
        if self.sent is None:
            self.ahead = params.new_zeros(params.shape)  # what `params_for` returns

    def correct(self, params: torch.Tensor, grad: torch.Tensor, i: int) -> torch.Tensor:
        return grad

    def apply(self, params: torch.Tensor, grad: torch.Tensor, i: int) -> None:
        g = self.rule.direction(params, self.correct(params, grad, i))
        v = self.bufs[i]
        self.buf_sum.sub_(v)  # S ← S − v_old + v_new
        v.mul_(self.rule.cfg.momentum).add_(g)
        self.buf_sum.add_(v)
        params.add_(v, alpha=-self.rule.lr)

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        if self.sent is None:
            # One buffer for every admitted worker: θ and S do not change until the replies
            # are sent, so workers admitted together are sent the same look-ahead.
            ahead = self.ahead
        else:
            ahead = self.sent[worker_slot(self.rule, worker, self.rule.num_workers)]
        rate = self.rule.applied_lr * self.rule.cfg.momentum
        ahead.copy_(params).add_(self.buf_sum, alpha=-rate)
        return ahead

    @staticmethod
    def worker_message(cfg: DanaConfig, grad: torch.Tensor, state: dict) -> torch.Tensor:
        return grad


@stored
class DelayCompensated(ServerMomentum):
    """dc (§9.4): zero, with g ← g + λ·g⊙g⊙(θ − θ̂_i) before weight decay and momentum, θ̂_i
    the look-ahead last sent to worker i (so it always keeps them)."""

    def __init__(self, rule: Dana, params: torch.Tensor, keep_sent: bool):
        super().__init__(rule, params, keep_sent=True)

    def correct(self, params: torch.Tensor, grad: torch.Tensor, i: int) -> torch.Tensor:
        correction = params.sub(self.sent[i]).mul_(grad).mul_(grad)
        return grad.add(correction, alpha=self.rule.cfg.dc_lambda)


@stored
class WorkerMomentum:
    """slim (§9.3): the workers keep their buffers (`worker_message` sends m = γv_i + g, v_i
    already updated); the server keeps only Φ, applies Φ ← Φ − η(m + wd·Φ) and sends Φ.
    It equals zero's look-ahead exactly only for constant η and wd = 0 (weight decay and a
    changing η act on Φ, not on θ)."""

    sent = None

    def __init__(self, rule: Dana, params: torch.Tensor, keep_sent: bool):
        self.rule = rule

    def apply(self, params: torch.Tensor, grad: torch.Tensor, i: int) -> None:
        params.add_(self.rule.direction(params, grad), alpha=-self.rule.lr)

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        return params  # Φ is already the look-ahead

    @staticmethod
    def worker_message(cfg: DanaConfig, grad: torch.Tensor, state: dict) -> torch.Tensor:
        """v ← γv + g (v kept in `state`, zeros at first); send γv + g."""
        v = state.get("v")
        if v is None:
            v = state["v"] = grad.new_zeros(grad.shape)
        v.mul_(cfg.momentum).add_(grad)
        return grad.add(v, alpha=cfg.momentum)


# the variant's state and steps, chosen once when the rule is built
VARIANT_CLASSES = {"zero": ServerMomentum, "slim": WorkerMomentum, "dc": DelayCompensated}


@UPDATES.register("dana", DanaConfig)
class Dana(SGD):
    """DANA: each worker computes its gradient at the look-ahead θ − ηγ·Σ_j v_j, where θ will be
    after every worker's momentum applies once more, Hakimi et al., arXiv 1907.11612
    (docs/algorithms.md §9). `cfg.variant` picks where the momentum lives and what is sent:
    zero (`ServerMomentum`), dc (`DelayCompensated`) or slim (`WorkerMomentum`).

    slim keeps no per-worker server state, but `per_worker` is a class attribute and stays
    True: its messages belong to one worker's momentum, so a round's average of them is not
    DANA either."""

    elementwise = False  # state beyond θ's shape (per worker, or a read θ)

    per_worker = True
    keeps_sent = False  # a subclass that measures against each look-ahead sent sets True

    def __init__(self, cfg: DanaConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.variant = VARIANT_CLASSES[cfg.variant](self, params, keep_sent=self.keeps_sent)

    @property
    def applied_lr(self) -> float:
        """η of the update last applied, which the look-ahead θ − ηγS scales S by: the DANA
        code computes it after the step from the optimizer's rate, before the next update's
        warm-up rate is set (`update_worker` in its utils.py). Before any update S = 0."""
        return self.rate(max(self.updates - 1, 0))

    @property
    def bufs(self) -> torch.Tensor:
        return self.variant.bufs  # v_i (not slim)

    @property
    def buf_sum(self) -> torch.Tensor:
        return self.variant.buf_sum  # S = Σ_i v_i (not slim)

    @property
    def sent(self) -> torch.Tensor | None:
        return self.variant.sent  # θ̂_i, the look-ahead sent to worker i, when kept

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        i = worker_slot(self, worker, self.num_workers)  # slim too: m is one worker's momentum
        self.variant.apply(params, grad, i)

    def params_for(self, params: torch.Tensor, worker: int) -> torch.Tensor:
        return self.variant.params_for(params, worker)

    @classmethod
    def worker_message(cls, cfg: DanaConfig, grad: torch.Tensor, state: dict) -> torch.Tensor:
        """slim: the worker's momentum message (`WorkerMomentum`). Else: g."""
        return VARIANT_CLASSES[cfg.variant].worker_message(cfg, grad, state)


@dataclasses.dataclass
class DanaGapAwareConfig(DanaConfig):
    beta: float = 0.999  # Gap-Aware: EMA decay of the squared step direction that sets C
    eps: float = 1e-8  # Gap-Aware: added to the bias-corrected RMS in C = η_max·(RMS + eps)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.variant == "slim":
            raise ConfigError(
                "algorithm.update.variant=slim: dana_ga needs the server's per-worker buffers "
                "and look-aheads (variant zero or dc)"
            )
        check_gap_statistics(self.beta, self.eps)


@UPDATES.register("dana_ga", DanaGapAwareConfig)
class DanaGapAware(Dana):
    """DANA-GA: DANA (zero or dc) with each gradient divided element-wise by Gap-Aware's
    penalty G = 1 + |θ − θ̂_i| / C, the gap taken against the look-ahead θ̂_i that worker i
    was sent, Barkai, Hakimi & Schuster, ICLR 2020 (their DANA-GA). As in Gap-Aware the
    weight-decay term is penalised with the gradient and the EMA behind C sees the momentum
    buffer before the step; DANA has one per worker, and the pushing worker's v_i is the one
    its step moves, so that is the one observed (a decision: the paper's code is not public)."""

    keeps_sent = True  # the gap is taken against the look-ahead each worker was sent

    def __init__(self, cfg: DanaGapAwareConfig, params: torch.Tensor, num_workers: int):
        super().__init__(cfg, params, num_workers)
        self.gap = GapStatistics(params, cfg.beta, cfg.eps)
        self.penalty: torch.Tensor | None = None  # G of the last gradient applied

    def apply(self, params: torch.Tensor, grad: torch.Tensor, worker: int, lag: int) -> None:
        i = worker_slot(self, worker, self.num_workers)
        self.gap.observe(self.bufs[i], self.lr)
        self.penalty = self.gap.penalty(params, self.sent[i])
        super().apply(params, grad, worker, lag)

    def direction(self, params: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return super().direction(params, grad).div(self.penalty)

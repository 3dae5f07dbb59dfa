"""Local-update algorithms (docs/algorithms.md §11): every worker takes H steps of an *inner*
optimizer on its own replica, then the replicas are reconciled by an *outer* rule applied
to the pseudo-gradient Δ_i = θ − x_i (θ: the global parameters the round started from,
x_i: worker i's replica after its H steps).

    inner (algorithm/inner=)  sgd | momentum | adamw, state kept across rounds by default,
                              its step constant or decaying per inner step (lr_decay)
    outer (algorithm/outer=)  average (local SGD) | nesterov (DiLoCo) | elastic (EASGD)
                              | leader (LSGD)

Both are pure: flat tensors in, tensors changed in place; how Δ travels (an all-reduce,
fragments, a server) is the local engine's business.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

from stalebench.algorithms.torch_optim import (
    KeepsOptimizer,
    check_torch_fields,
    torch_optimizer,
    torch_step,
)
from stalebench.errors import ConfigError
from stalebench.registry import ComponentConfig, Part, Registry

if TYPE_CHECKING:
    import torch


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")


def _unit(key: str, value: float, closed: bool = False) -> None:
    if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
        raise ConfigError(f"{key} must be in [0, 1{']' if closed else ')'}, got {value}")


# ---------------------------------------------------------------------------- inner

LR_DECAYS = ("none", "inverse_sqrt", "cosine")


def lr_factor(decay: str, k: int, steps: int) -> float:
    """The inner step's multiplier at the worker's inner step k (0-based), `steps` = T:
    none 1; inverse_sqrt 1/√(1 + k/T) (halved at k = 3T, never 0); cosine
    ½(1 + cos(π·min(k, T)/T)), from 1 at k = 0 to 0 at k = T, and 0 after."""
    if decay == "none":
        return 1.0
    if decay == "inverse_sqrt":
        return 1.0 / math.sqrt(1.0 + k / steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(k, steps) / steps))


@dataclasses.dataclass
class InnerConfig(ComponentConfig):
    lr: float = 0.1  # the inner learning rate (plain SGD: as algorithm/update=sgd)
    weight_decay: float = 0.0  # sgd, momentum: L2 in the gradient; adamw: decoupled
    # start every round with fresh optimizer state (momentum, Adam moments and step count);
    # false (the default, as DiLoCo): the state carries over from round to round
    reset: bool = False
    # the step's schedule over the worker's inner steps k = 0, 1, …: lr × lr_factor(k)
    # (none | inverse_sqrt | cosine, see `lr_factor`), T = lr_decay_steps; none: constant
    lr_decay: str = "none"
    lr_decay_steps: int = 0  # T, in inner steps (> 0 with a decay, 0 without)

    def __post_init__(self) -> None:
        _positive("algorithm.inner.lr", self.lr)
        if self.weight_decay < 0:
            raise ConfigError(f"algorithm.inner.weight_decay must be >= 0, got {self.weight_decay}")
        if self.lr_decay not in LR_DECAYS:
            raise ConfigError(
                f"algorithm.inner.lr_decay must be one of {', '.join(LR_DECAYS)}, "
                f"got {self.lr_decay!r}"
            )
        if (self.lr_decay == "none") != (self.lr_decay_steps == 0) or self.lr_decay_steps < 0:
            raise ConfigError(
                f"algorithm.inner.lr_decay_steps must be > 0 with a decay and 0 with "
                f"lr_decay=none (it is {self.lr_decay}), got {self.lr_decay_steps}"
            )


@dataclasses.dataclass
class MomentumConfig(InnerConfig):
    momentum: float = 0.9
    nesterov: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_torch_fields(self, "algorithm.inner")


@dataclasses.dataclass
class AdamWConfig(InnerConfig):
    # DiLoCo's inner optimizer (torchft's example: lr 4e-4, betas (0.9, 0.95), wd 0.1)
    lr: float = 4e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        check_torch_fields(self, "algorithm.inner")


class InnerOptimizer(KeepsOptimizer, Part):
    """A worker's optimizer over its flat replica `x` (updated in place by `step`): torch's
    class `optimizer`, its arguments from the config (`torch_optimizer`). With
    `lr_decay`, torch's LambdaLR sets the step before each inner step k to lr ×
    lr_factor(k); k counts every inner step the worker takes (a round's `reset` does not
    restart it). Without one, no scheduler exists: the constant step is what it was."""

    optimizer: ClassVar[str] = "SGD"

    def __init__(self, cfg: InnerConfig, x: torch.Tensor):
        self.cfg, self.x = cfg, x
        self.opt = self._build()
        self.schedule = self._schedule()

    @classmethod
    def needs(cls, cfg: InnerConfig) -> dict[str, str]:
        """reset: rounds, to start each with fresh state."""
        return {"rounds": "reset=true"} if cfg.reset else {}

    def _build(self):
        # one tensor: torch's single-tensor code path (foreach=False)
        return torch_optimizer(self.optimizer, [self.x], self.cfg, foreach=False)

    def _schedule(self):
        if self.cfg.lr_decay == "none":
            return None
        import torch

        decay, steps = self.cfg.lr_decay, self.cfg.lr_decay_steps
        return torch.optim.lr_scheduler.LambdaLR(self.opt, lambda k: lr_factor(decay, k, steps))

    # pickled with the optimizer's and the scheduler's state_dicts (KeepsOptimizer): the
    # scheduler's function is not data
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        return {**state, "schedule": self.schedule and self.schedule.state_dict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self.opt = self._build()
        self.schedule = self._schedule()  # its first step sets the lr the state then resets
        self.opt.load_state_dict(state["opt"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])

    def step(self, grad: torch.Tensor) -> None:
        torch_step(self.opt, [self.x], grad)
        if self.schedule is not None:
            self.schedule.step()  # the step of the next inner step

    @property
    def lr(self) -> float:
        """The step the next inner step takes."""
        return float(self.opt.param_groups[0]["lr"])

    def new_round(self) -> None:
        """Called when a round starts: drops the state when `reset` is set."""
        if self.cfg.reset:
            self.opt.state.clear()


INNER: Registry[InnerOptimizer] = Registry(
    "inner optimizer", "algorithm/inner", "algorithm.inner", InnerConfig
)


@INNER.register("sgd", InnerConfig)
class InnerSGD(InnerOptimizer):
    """x ← x − η(g + λx)."""


@INNER.register("momentum", MomentumConfig)
class InnerMomentum(InnerOptimizer):
    """Heavy-ball (or Nesterov) momentum SGD, torch's convention: b ← μb + g, x ← x − ηb."""


@INNER.register("adamw", AdamWConfig)
class InnerAdamW(InnerOptimizer):
    """AdamW (Loshchilov & Hutter): DiLoCo's inner optimizer."""

    optimizer = "AdamW"


# ---------------------------------------------------------------------------- outer


@dataclasses.dataclass
class OuterConfig(ComponentConfig):
    inner_steps: int = 10  # H: inner steps per round

    def __post_init__(self) -> None:
        if self.inner_steps < 1:
            raise ConfigError(f"algorithm.outer.inner_steps must be >= 1, got {self.inner_steps}")


@dataclasses.dataclass
class NesterovConfig(OuterConfig):
    lr: float = 0.7  # DiLoCo's outer learning rate
    momentum: float = 0.9  # DiLoCo's outer momentum μ
    # delayed Nesterov (Liu et al. 2024): the momentum term only every `delay` outer
    # steps, plain steps in between; 1 = Nesterov at every step
    delay: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("algorithm.outer.lr", self.lr)
        _unit("algorithm.outer.momentum", self.momentum)
        if self.delay < 1:
            raise ConfigError(f"algorithm.outer.delay must be >= 1, got {self.delay}")


@dataclasses.dataclass
class ElasticConfig(OuterConfig):
    # α: the elastic pull; the centre moves by α·Σ_i (x_i − x̃), so N·α (the paper's β)
    # must stay <= 1. 0: α = 0.9/N, the paper's β = 0.9
    alpha: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"algorithm.outer.alpha must be in [0, 1], got {self.alpha}")

    def pull(self, num_workers: int) -> float:
        return self.alpha or 0.9 / num_workers


@dataclasses.dataclass
class LeaderConfig(OuterConfig):
    pull: float = 0.1  # λ: x_i ← x_i − λ(x_i − x_l), x_l the leader of i's group
    # LSGD's two levels: workers in `groups` consecutive groups, each with a local leader;
    # global_pull λ_G pulls toward the best of all (0 = one level)
    groups: int = 1
    global_pull: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _unit("algorithm.outer.pull", self.pull, closed=True)
        _unit("algorithm.outer.global_pull", self.global_pull, closed=True)
        if self.groups < 1:
            raise ConfigError(f"algorithm.outer.groups must be >= 1, got {self.groups}")


class OuterRule(Part):
    """Reconciles the replicas after a round.

    `exchange` says what the workers share: "mean" (the mean pseudo-gradient, by one
    all-reduce of Δ_i) or "leaders" (the parameters of the best replica of each group, by
    one all-reduce that only the leaders fill). `step` updates θ; `replica` makes a worker's
    replica for the next round."""

    exchange: ClassVar[str] = "mean"

    def __init__(self, cfg: OuterConfig, theta: torch.Tensor, num_workers: int):
        self.cfg, self.num_workers = cfg, num_workers

    def step(self, theta: torch.Tensor, mean_delta: torch.Tensor) -> None:
        """θ ← the outer step with the round's mean pseudo-gradient (in place)."""
        raise NotImplementedError

    def replica(self, x: torch.Tensor, delta: torch.Tensor, theta: torch.Tensor) -> None:
        """Worker's replica `x` (in place) for the next round, given its own Δ and the new
        θ. Default: restart from θ (local SGD, DiLoCo)."""
        x.copy_(theta)


OUTER: Registry[OuterRule] = Registry(
    "outer rule", "algorithm/outer", "algorithm.outer", OuterConfig
)


@OUTER.register("average", OuterConfig)
class Average(OuterRule):
    """Local SGD / model averaging: θ ← θ − mean Δ (the mean of the replicas)."""

    def step(self, theta, mean_delta):
        theta.sub_(mean_delta)


@OUTER.register("nesterov", NesterovConfig)
class Nesterov(OuterRule):
    """DiLoCo's outer SGD with Nesterov momentum on Δ (torch's convention):
    b ← μb + Δ, θ ← θ − η(Δ + μb).

    With `delay` N > 1, delayed Nesterov: steps between momentum updates are plain,
    θ ← θ − ηΔ; every N-th step folds the N pseudo-gradients since the last one into the
    buffer, b ← μb + ΣΔ, and steps θ ← θ − η(Δ + μb). Our reading of Liu et al. (2024),
    not checked against the paper's algorithm (docs/algorithms.md §11.10)."""

    def __init__(self, cfg, theta, num_workers):
        super().__init__(cfg, theta, num_workers)
        self.buf = theta.new_zeros(theta.shape)
        self.pending = theta.new_zeros(theta.shape)  # Δs since the last momentum update
        self.steps = 0

    def step(self, theta, mean_delta):
        c = self.cfg
        self.steps += 1
        if self.steps % c.delay:  # between momentum updates: a plain step
            self.pending.add_(mean_delta)
            theta.sub_(mean_delta, alpha=c.lr)
            return
        self.buf.mul_(c.momentum).add_(self.pending.add_(mean_delta))
        self.pending.zero_()
        theta.sub_(mean_delta.add(self.buf, alpha=c.momentum), alpha=c.lr)


@OUTER.register("elastic", ElasticConfig)
class Elastic(OuterRule):
    """EASGD, synchronous (Zhang, Choromanska and LeCun, 2015): x_i ← x_i − α(x_i − x̃) and
    x̃ ← x̃ + α Σ_i (x_i − x̃), both with the centre x̃ = θ of the round's start (Δ_i = x̃ − x_i).
    The replicas are never reset to the centre; θ, the centre, is what is evaluated.
    α defaults to 0.9/N (the paper's β = Nα = 0.9)."""

    @classmethod
    def check(cls, cfg: ElasticConfig, num_workers: int, run: Any = None) -> None:
        alpha, n = cfg.alpha, num_workers
        if alpha * n > 1:
            raise ConfigError(
                f"algorithm.outer.alpha={alpha} with cluster.num_workers={n}: the centre moves "
                f"by N·α = {alpha * n:g} > 1 of the replicas' spread and overshoots; use "
                f"alpha <= {1 / n:g} (0 = 0.9/N)"
            )

    def step(self, theta, mean_delta):
        theta.sub_(mean_delta, alpha=self.cfg.pull(self.num_workers) * self.num_workers)

    def replica(self, x, delta, theta):
        x.add_(delta, alpha=self.cfg.pull(self.num_workers))


@OUTER.register("leader", LeaderConfig)
class Leader(OuterRule):
    """LSGD (Teng et al., NeurIPS 2019): each replica is pulled toward the leader of its
    group, the replica with the lowest training loss this round, and (with global_pull)
    toward the best of all: x_i ← x_i − λ(x_i − x_l) − λ_G(x_i − x_g). Leaders are not
    pulled; θ, what is evaluated, is the global leader's replica."""

    exchange = "leaders"

    @classmethod
    def check(cls, cfg: LeaderConfig, num_workers: int, run: Any = None) -> None:
        if cfg.groups > num_workers:
            raise ConfigError(
                f"algorithm.outer.groups={cfg.groups} exceeds cluster.num_workers={num_workers}"
                ": every group needs a worker"
            )

    def groups(self) -> list[range]:
        """The workers of each group: `groups` consecutive, near-equal blocks."""
        n, g = self.num_workers, min(self.cfg.groups, self.num_workers)
        bounds = [n * k // g for k in range(g + 1)]
        return [range(bounds[k], bounds[k + 1]) for k in range(g)]

    def leaders(self, losses: list[float]) -> tuple[list[int], int]:
        """Each group's leader (the lowest loss, ties to the lowest index), and the group
        whose leader has the lowest loss of all (the global leader's group)."""
        leaders = [min(group, key=lambda w: (losses[w], w)) for group in self.groups()]
        best = min(range(len(leaders)), key=lambda k: (losses[leaders[k]], k))
        return leaders, best

    def pull(
        self, x: torch.Tensor, worker: int, leaders: list[int], best: int, params: torch.Tensor
    ) -> None:
        """Pull replica `x` of `worker` toward its group's leader and, with global_pull,
        toward the global leader; `params[k]` is group k's leader's replica."""
        group = next(k for k, g in enumerate(self.groups()) if worker in g)
        pulls = []  # both from the replica before either pull
        if worker != leaders[group]:
            pulls.append((x - params[group]).mul_(self.cfg.pull))
        if self.cfg.global_pull and worker != leaders[best]:
            pulls.append((x - params[best]).mul_(self.cfg.global_pull))
        for move in pulls:
            x.sub_(move)

    def step(self, theta, mean_delta):
        raise TypeError("outer=leader exchanges the leaders' replicas, not a mean Δ")
